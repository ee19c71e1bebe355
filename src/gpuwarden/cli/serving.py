"""What the long-running commands that serve HTTP beside a health watch share
(`exporter`, `web`): their two common options, their warnings through `logging`,
and running until SIGINT or SIGTERM."""

from __future__ import annotations

TYPE_CHECKING = False  # argparse is read only by type checkers here
if TYPE_CHECKING:
    import argparse
    from collections.abc import Callable


def add_watch_and_once(parser: argparse.ArgumentParser, once: str) -> None:
    """`--no-watch` (no health watch beside the server) and `--once` (`once` says what
    is printed instead of serving)."""
    parser.add_argument(
        "--no-watch",
        action="store_true",
        help="do not run the health watch (no XID listener, no automatic drains)",
    )
    parser.add_argument("--once", action="store_true", help=f"print {once} once to stdout and exit")


def warner(logger: str) -> Callable[[str], None]:
    """A warning through `logging`, whose format and level the CLI sets once (--log-level)."""

    def warn(message: str) -> None:
        import logging

        logging.getLogger(logger).warning(message)

    return warn


def until_signalled(close: Callable[[], None]) -> int:
    """Serve until SIGINT or SIGTERM, then `close()`; the exit status 0."""
    import signal
    import threading

    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    while not stop.wait(1.0):
        pass
    close()
    return 0
