"""Jobs: the one path from a request to a running job and back.

    request -> read the machine -> choose -> lease -> launch -> publish -> ... -> release

`gpuwarden run`, `gpuwarden reserve`, `gpuwarden.lease()` and the queue service
take their GPUs through here (`jobpath` decides which way), so the order that
keeps leases honest is written once: the lease record is prepared before the job
starts (a full disk fails before anything runs), a job never runs under a lease
others cannot see (it is killed if publishing fails), and every failure on the
way releases what was taken. The command line and the Python API only parse,
call, print and map errors; choosing is `selection`, waiting in line
`allocation`, the locks `leases`, the child process `launch`.
"""

from __future__ import annotations

import os
import signal
import time

from gpuwarden.errors import UserError

TYPE_CHECKING = False  # annotations only: the run path does not import typing
if TYPE_CHECKING:
    from collections.abc import Callable, Collection, Mapping, Sequence
    from typing import Any, Optional

    from gpuwarden.launch import StartedJob
    from gpuwarden.leases import Held


class MachineReader:
    """Reads the machine for selection: the first reading is kept for the parent
    CUDA_VISIBLE_DEVICES check and the first attempt; later attempts read afresh."""

    def __init__(self, topology: bool, read: Optional[Callable[..., Any]] = None) -> None:
        if read is None:
            from gpuwarden.inventory import read_snapshot

            def read(**how: Any) -> Any:
                return read_snapshot(detail=False, **how)  # what the choice decides on

        self._read = read
        self._topology = topology
        self.first = read(processes=True, topology=topology)
        self._fresh = True

    def __call__(self) -> Any:
        if self._fresh:
            self._fresh = False
            return self.first
        return self._read(processes=True, topology=self._topology)


def allowed(snapshot: Any, environ: Optional[Mapping[str, str]] = None) -> Optional[Sequence[str]]:
    """The GPUs a parent CUDA_VISIBLE_DEVICES leaves to us (None: unset, all of them).
    The reading side (`visible`) is loaded only when the variable is set."""
    env = os.environ if environ is None else environ
    if "CUDA_VISIBLE_DEVICES" not in env:
        return None
    from gpuwarden.visible import allowed_uuids

    return allowed_uuids(snapshot, env)


def lease(
    request: Any,
    machine: Callable[[], Any],
    *,
    wait: bool = False,
    timeout: Optional[float] = None,
    allowed: Optional[Collection[str]] = None,
    job: Optional[str] = None,
    on_wait: Optional[Callable[[int, int, str, float], None]] = None,
    conf: Any = None,
) -> Held:
    """Lease GPUs for `request` (`allocation.acquire`): the allocation lock stays held
    until the returned lease is published by `launch_leased` or `publish_here`.
    `conf` is the caller's reading of the configuration (None: the one in force)."""
    from gpuwarden.allocation import acquire

    return acquire(
        request,
        snapshot=machine,
        wait=wait,
        timeout=timeout,
        allowed=allowed,
        job=job,
        on_wait=on_wait,
        conf=conf,
    )


def launch_leased(
    held: Held,
    argv: Sequence[str],
    env: Mapping[str, str],
    command: str,
    before_start: Optional[Callable[[], None]] = None,
    start: Optional[Callable[[Sequence[str], Mapping[str, str], Sequence[int]], StartedJob]] = None,
) -> StartedJob:
    """Start `argv` holding `held`'s descriptors and publish it as the lease's job.

    The record is prepared first (a full disk fails here, nothing started);
    `before_start` (a device cgroup, say) runs next; `start` replaces `launch.start` (a
    container's client, gpuwarden.containers). On any failure the lease is
    released, and a job that started but could not be published is killed: a job
    must never run under a lease others cannot see."""
    from gpuwarden import launch

    try:
        held.prepare(command)
        if before_start is not None:
            before_start()
        job = (start or launch.start)(argv, env, held.fds)
    except BaseException:
        held.release()
        raise
    try:
        held.publish(job.pid)
    except BaseException:
        try:
            os.killpg(job.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        job.wait()
        held.release()
        raise
    return job


def publish_here(held: Held, command: str) -> None:
    """Publish `held` as this process's own lease (the Python API's `with` block)."""
    try:
        held.publish(os.getpid(), command)
    except BaseException:
        held.release()
        raise


def choose_now(
    snapshot: Any, request: Any, allowed: Optional[Collection[str]], conf: Any = None
) -> Any:
    """What `lease` would choose now, leasing nothing: the `selection.Choice` against
    the leases and drains of this moment (`conf`: the caller's reading of the
    configuration, None: the one in force)."""
    from gpuwarden import leases
    from gpuwarden.drain import list_drains
    from gpuwarden.health.xidlog import judged
    from gpuwarden.locations import lease_location, state_location
    from gpuwarden.selection import choose

    drains = list_drains(state_location(conf))
    held = leases.list_leases(lease_location(conf))
    return choose(snapshot, request, held, drains, allowed, judged(snapshot.gpus, conf=conf))


def waiting_count(conf: Any = None) -> int:
    """How many requests wait in line (they are served before a new one)."""
    from gpuwarden import waitline
    from gpuwarden.leases.dir import open_dir
    from gpuwarden.locations import lease_location

    return len(waitline.read_line(open_dir(lease_location(conf))))


def within_enclosing(
    snapshot: Any,
    request: Any,
    allowed: Optional[Collection[str]],
    environ: Optional[Mapping[str, str]] = None,
    conf: Any = None,
) -> Optional[tuple[Any, ...]]:
    """Inside a shell set up by `gpuwarden reserve` (GPUWARDEN_RESERVATION), or inside a
    job started by `gpuwarden run` (GPUWARDEN_JOB), a nested job runs on those GPUs under
    the enclosing lease instead of waiting for it to end. None when there is no live
    enclosing lease of ours. `conf`: the caller's reading of the configuration (None:
    the one in force)."""
    env = os.environ if environ is None else environ
    enclosing = [env.get(n) for n in ("GPUWARDEN_RESERVATION", "GPUWARDEN_JOB")]
    enclosing = [e for e in enclosing if e]
    if not enclosing:
        return None
    from gpuwarden import leases
    from gpuwarden.drain import list_drains
    from gpuwarden.health.xidlog import judged
    from gpuwarden.locations import lease_location, state_location
    from gpuwarden.paths import user_name
    from gpuwarden.selection import choose

    held = leases.list_leases(lease_location(conf))
    me = user_name(os.geteuid())
    for rid in enclosing:
        ours = {i.uuid for i in held if i.job == rid and i.user == me}
        if not ours:
            continue  # ended or expired: lease normally
        scope = ours if allowed is None else ours & set(allowed)
        others = [i for i in held if i.job != rid]
        drains = list_drains(state_location(conf))
        choice = choose(snapshot, request, others, drains, scope, judged(snapshot.gpus, conf=conf))
        if not choice.ok:
            raise UserError(f"within {rid}: {choice.error}")
        return choice.gpus
    return None


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
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            try:
                os.waitpid(pid, 0)
            except ChildProcessError:
                pass
        held.release()
        raise
    finally:
        held.close()  # our copies; the holder keeps its own
    return pid
