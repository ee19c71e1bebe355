"""A lease kept by a detached holder process: `gpuwarden reserve`'s and a Slurm job's.

The holder is a fork of the caller in a session of its own, with no terminal, that
keeps the lease descriptors open until it is signalled or its time runs out (on a
clock that never steps). The lease record is prepared before it starts and
published with its pid, so nobody else ever sees a reservation that no process
holds, and no holder ever outlives a reservation that nobody can see.

Where a queue service owns the GPUs, the holder keeps an allocation of the service
instead (queueclient.holding, as `gpuwarden.lease()` holds one): the service times
it and frees it, and the holder's death closes its connection, which cancels it.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time

from gpuwarden.base.errors import UserError

TYPE_CHECKING = False  # annotations only
if TYPE_CHECKING:
    from collections.abc import Callable
    from types import FrameType
    from typing import Any, Optional

    from gpuwarden.config import Config
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

        def stop(_signum: int, _frame: Optional[FrameType]) -> None:
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


def hold_allocation_in_background(
    fields: dict[str, Any],
    path: str,
    conf: Config,
    *,
    wait: bool,
    timeout: Optional[float],
    time_option: str,
) -> tuple[int, int, list[str]]:
    """(holder pid, job id, GPU uuids) of an allocation of the queue service at `path`
    for the submit `fields`, kept by a detached holder process until it is signalled
    or the service ends the job (its time limit, a cancel). The holder asks for it
    (in line with `wait`, up to `timeout`) and says what it got; a refusal is raised
    here in the holder's words (`time_option` named for a missing or long time). Cut
    short here (Ctrl-C while waiting), the holder is stopped, and the service
    cancels what it asked for."""
    import json

    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read_end)
        _allocation_holder(fields, path, conf, wait, timeout, time_option, write_end)
    os.close(write_end)
    answer = b""
    try:
        while data := os.read(read_end, 65536):
            answer += data
    except BaseException:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)  # its connection closes: the service cancels
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, 0)
        raise
    finally:
        os.close(read_end)
    try:
        said = json.loads(answer or b"{}")
    except ValueError:
        said = {}
    if "job" not in said:
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, 0)
        error = said.get("error") or "the reservation holder could not start"
        raise UserError(str(error), exit_code=int(said.get("exit_code") or 1))
    return pid, int(said["job"]), [str(u) for u in said.get("gpus") or ()]


def _allocation_holder(
    fields: dict[str, Any],
    path: str,
    conf: Config,
    wait: bool,
    timeout: Optional[float],
    time_option: str,
    ready_fd: int,
) -> None:
    """The background holder of an allocation: tells `ready_fd` what it got (or why
    not) as JSON, then keeps it until told to stop or the job ends. Never returns."""
    import json

    from gpuwarden.queueclient import holding

    code = 0
    try:
        os.setsid()
        null = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(null, fd)
        os.close(null)

        def stop(_signum: int, _frame: Optional[FrameType]) -> None:
            raise SystemExit(0)

        for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(signum, stop)
        try:
            with holding.hold(
                fields, path, wait, timeout, conf, time_option, argv=holding.RESERVATION
            ) as (job, uuids, _fds, ended):
                os.write(ready_fd, json.dumps({"job": job, "gpus": uuids}).encode())
                os.close(ready_fd)
                ready_fd = -1
                ended.wait()
        except UserError as err:
            said = {"error": str(err), "exit_code": err.exit_code}
            os.write(ready_fd, json.dumps(said).encode())
    except SystemExit:
        pass
    except BaseException:
        code = 1
    finally:
        os._exit(code)
