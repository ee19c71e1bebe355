"""A lease kept by a detached holder process: `gpuwarden reserve`'s and a Slurm job's.

The holder is a fork of the caller in a session of its own, with no terminal, that
keeps the lease descriptors open until it is signalled or its time runs out (on a
clock that never steps). The lease record is prepared before it starts and
published with its pid, so nobody else ever sees a reservation that no process
holds, and no holder ever outlives a reservation that nobody can see.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time

from gpuwarden.errors import UserError

TYPE_CHECKING = False  # annotations only
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any, Optional

    from gpuwarden.leases import Held


def boottime() -> float:
    """Seconds on a clock that never steps (CLOCK_BOOTTIME: it also counts suspend, so
    `--for 4h` ends 4 h later however the wall clock is set meanwhile)."""
    clock = getattr(time, "CLOCK_BOOTTIME", None)
    return time.clock_gettime(clock) if clock is not None else time.monotonic()


def hold_for(seconds: Optional[float], sleep: Callable[[float], Any] = time.sleep) -> None:
    """Return after `seconds` on the boot clock (never, for None). Stepping the wall
    clock back or forth does not change when it returns."""
    deadline = None if seconds is None else boottime() + seconds
    while True:
        left = None if deadline is None else deadline - boottime()
        if left is not None and left <= 0:
            return
        sleep(3600 if left is None else min(left, 3600))


def _holder(held: Held, ready_fd: int, seconds: Optional[float]) -> None:
    """The background holder: keeps the lease descriptors open until told to stop or the
    reservation runs out. Never returns."""
    code = 0
    try:
        os.setsid()
        null = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(null, fd)
        os.close(null)
        held.drop_allocation_lock()  # our copy only: the parent holds it until publish

        def stop(_signum: int, _frame: Any) -> None:
            raise SystemExit(0)

        for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(signum, stop)
        os.write(ready_fd, b"ok")
        os.close(ready_fd)
        hold_for(seconds)
    except SystemExit:
        pass
    except BaseException:
        code = 1
    finally:
        held.release()
        os._exit(code)


def hold_in_background(
    held: Held, command: str, *, expires: Optional[float], seconds: Optional[float]
) -> int:
    """Hand `held` to a detached holder process (a fork, in its own session, with no
    terminal) that keeps the lease until signalled or `seconds` pass, and publish it
    with the holder's pid; return that pid. The record is prepared first (a full disk
    fails before any holder starts). On failure no holder outlives a reservation that
    nobody can see, and the lease is released. Either way this process keeps no copy."""
    pid = 0
    try:
        held.prepare(command, expires=expires)
        read_end, write_end = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(read_end)
            _holder(held, write_end, seconds)
        os.close(write_end)
        ok = os.read(read_end, 2) == b"ok"
        os.close(read_end)
        if not ok:
            raise UserError("the reservation holder could not start")
        held.publish(pid)
    except BaseException:
        if pid:  # our own child
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, 0)
        held.release()
        raise
    finally:
        held.close()  # our copies; the holder keeps its own
    return pid
