"""Waiting for a lease on the command line: the live status line of `run` and
`reserve`, and the grant line after a wait. The waiting itself is
`gpuwarden.jobs.allocation`'s; this module only prints it."""

from __future__ import annotations

import sys
import time

from gpuwarden.base.units import format_span
from gpuwarden.jobs.allocation import acquire, describe_request

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Optional

    from gpuwarden.jobs.holding import MachineReader
    from gpuwarden.leases import Held


class WaitStatus:
    """The one-line live status while waiting: rewritten in place on a terminal, a new
    line only when it changes otherwise (a log file stays readable)."""

    def __init__(self, command: str, request: Any, stream: Any = None) -> None:
        self.prefix = f"gpuwarden {command}: waiting for {describe_request(request)}"
        self.stream = stream or sys.stderr
        self.tty = self.stream.isatty()
        self.last = ""
        self.shown = False

    def __call__(self, position: int, total: int, reason: str, elapsed: float) -> None:
        where = f"{_ordinal(position)} in line" + (f" of {total}" if total > 1 else "")
        text = f"{self.prefix} ({where}): {reason}"
        if self.tty:
            from gpuwarden.base.table import columns

            width = columns(100) - 1
            line = f"{text} [{format_span(elapsed)}]"
            if len(line) > width:
                line = line[: width - 1] + "…"
            self.stream.write("\r\x1b[K" + line)
            self.stream.flush()
            self.shown = True
        elif text != self.last:
            self.stream.write(text + "\n")
            self.stream.flush()
            self.shown = True
        self.last = text

    def done(self, gpus: Any, elapsed: float) -> None:
        if not self.shown:
            return
        ids = ",".join(str(g.index) for g in gpus)
        end = (
            f"\r\x1b[K{self.prefix.split(':')[0]}: "
            if self.tty
            else f"{self.prefix.split(':')[0]}: "
        )
        self.stream.write(f"{end}granted GPU {ids} after {format_span(elapsed)}\n")
        self.stream.flush()


def take(
    command: str,
    conf: Any,
    request: Any,
    machine: MachineReader,
    allowed: Any,
    job: Optional[str] = None,
) -> Held:
    """Lease for `request` as `gpuwarden <command>` does: in line with the live status
    when `run.wait` is set, and a last line saying what was granted after a wait."""
    status = WaitStatus(command, request)
    started = time.monotonic()
    held = acquire(
        request,
        snapshot=machine,
        wait=bool(conf.get("run.wait")),
        timeout=conf.get("run.timeout"),
        allowed=allowed,
        job=job,
        on_wait=status,
        conf=conf,
    )
    try:
        status.done(held.gpus, time.monotonic() - started)
    except BaseException:
        held.release()
        raise
    return held


def _ordinal(n: int) -> str:
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"
