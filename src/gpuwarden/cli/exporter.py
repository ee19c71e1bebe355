"""`gpuwarden exporter`: serve /metrics and run the health watch beside it."""

from __future__ import annotations

import sys

TYPE_CHECKING = False  # argparse is read only by type checkers here
if TYPE_CHECKING:
    import argparse

    from gpuwarden.cli import Commands


def register(commands: Commands, name: str) -> None:
    from gpuwarden.cli import subcommand

    parser = subcommand(commands, name)
    parser.add_argument(
        "--listen", metavar="HOST:PORT", help="address to serve (exporter.listen, 127.0.0.1:9400)"
    )
    parser.add_argument(
        "--dcgm-compat",
        action="store_true",
        default=None,
        help="also emit dcgm-exporter's DCGM_FI_* names and labels (exporter.dcgm_compat)",
    )
    parser.add_argument(
        "--no-watch",
        action="store_true",
        help="do not run the health watch (no XID listener, no automatic drains)",
    )
    parser.add_argument(
        "--once", action="store_true", help="print the metrics once to stdout and exit"
    )


def _warn(message: str) -> None:
    # Through logging: the CLI sets its format and level once (--log-level).
    import logging

    logging.getLogger("gpuwarden.exporter").warning(message)


def run(args: argparse.Namespace) -> int:
    import signal
    import threading

    from gpuwarden import config as config_module
    from gpuwarden import exporter
    from gpuwarden.healthwatch import rules_or_builtin, watch_beside

    exporter.require_client()  # before reading anything, `--once` included
    config = config_module.load(
        {"exporter.listen": args.listen, "exporter.dcgm_compat": args.dcgm_compat}
    )
    listen = str(config.get("exporter.listen"))
    dcgm = bool(config.get("exporter.dcgm_compat"))
    rules = rules_or_builtin(config, _warn)
    cache = exporter.ViewCache(
        cache_seconds=float(config.get("exporter.cache_seconds")),
        idle_util=float(config.get("exporter.idle_util")),
        idle_after=float(config.get("exporter.idle_seconds")),
        rules=rules,
    )
    if args.once:
        sys.stdout.write(exporter.render(cache.get(), dcgm))
        return 0
    watch = None
    if not args.no_watch:
        watch = watch_beside(config, cache.snapshot, rules, _warn, "metrics and drains")
    server = exporter.serve(listen, dcgm_compat=dcgm, cache=cache, watch=watch)
    host = f"[{server.host}]" if ":" in server.host else server.host
    _warn(
        f"serving http://{host}:{server.port}/metrics"
        + (" with DCGM names" if dcgm else "")
        + ("" if watch else " (health watch off)")
    )
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    while not stop.wait(1.0):
        pass
    server.close()
    return 0
