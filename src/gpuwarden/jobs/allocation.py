"""Allocation: choosing GPUs and taking their leases, waiting in line when asked.

`gpuwarden.leases` is the substrate (the directory, the per-GPU locks, their
records); `gpuwarden.leases.waitline` is the line of waiting requests. This module puts
them together: `attempt` chooses and takes under the allocation lock, serving the
earlier waiters first; `acquire` retries it, in line, until granted or out of time;
`choose_now` says what it would choose, leasing nothing (a dry run, `gpuwarden.select()`).
See docs/leases.md.
"""

from __future__ import annotations

import os
import time
from collections.abc import Collection

from gpuwarden.base.errors import UserError
from gpuwarden.base.units import format_span
from gpuwarden.leases import (
    ALLOC,
    ALLOC_PATIENCE,
    EXIT_BUSY,
    AllocationBusy,
    Held,
    LeaseInfo,
    lock_within,
    needs,
    new_job_id,
    scan,
    sweep,
    tidy,
)
from gpuwarden.leases.dir import LeaseDir, open_dir

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Optional

    from gpuwarden.config import Config
    from gpuwarden.health.files import HealthFiles
    from gpuwarden.leases.spares import Spares
    from gpuwarden.leases.waitline import Ticket, Waiter
    from gpuwarden.machine.inventory import Snapshot
    from gpuwarden.placement.request import Request
    from gpuwarden.placement.selection import Choice


class Outcome:
    """One attempt: `held` on success; else the Choice that said no, or the earlier
    waiter that must be served first. (A plain class: it is never compared or
    printed, and every class made at import is paid by every `run`.)"""

    def __init__(
        self,
        held: Optional[Held],
        choice: Choice,
        ahead: int = 0,  # waiters read before us
        blocked_by: Optional[Waiter] = None,  # the first earlier waiter that does not fit yet
    ) -> None:
        self.held = held
        self.choice = choice
        self.ahead = ahead
        self.blocked_by = blocked_by


def attempt(
    ld: LeaseDir,
    request: Request,
    snapshot: Snapshot,
    *,
    allowed: Optional[Collection[str]] = None,
    job: Optional[str] = None,
    ticket: Optional[Ticket] = None,
    patience: float = 0.0,
    conf: Optional[Config] = None,
    health: Optional[HealthFiles] = None,
    spares: Optional[Spares] = None,
) -> Outcome:
    """Choose and take under the allocation lock, serving earlier waiters first.

    The allocation lock is tried for `patience` seconds (it is normally held for a few
    milliseconds); AllocationBusy, naming the holder, when it stays held.

    Earlier waiters are given, in order, what they would get now (as if leased); if
    one of them does not fit, nobody behind it is served (strict first come, first
    served: a large request is never starved by a stream of small ones). On success
    the allocation lock stays held until `Held.publish()`.

    `conf` is the caller's reading of the configuration: where the drains and XID logs
    are, and the health rules (None: the configuration in force, read here). `health`:
    a long-running caller's drains and XIDs, kept while their files are unchanged;
    `spares` its lease record files made ahead (leases.spares).
    """
    from gpuwarden.files.locations import state_location
    from gpuwarden.health import drain
    from gpuwarden.health.xidlog import judged
    from gpuwarden.placement.selection import choose

    alloc_fd = ld.open(ALLOC, os.O_RDONLY | os.O_CREAT)
    try:
        lock_within(alloc_fd, patience, ld.join(ALLOC))
        waiting: list[bool] = []
        temporaries: list[str] = []
        leases, stale = scan(ld, waiting, temporaries)
        if stale:
            tidy(ld, stale)
        if temporaries:
            sweep(ld, temporaries)
        if health is None:
            drains = drain.list_drains(state_location(conf))
            judgement = judged(snapshot.gpus, conf=conf)  # with the XIDs the watch heard
        else:
            drains = health.current(state_location(conf))[0]
            judgement = health.judged(snapshot.gpus, conf)
        mine = ticket.key if ticket is not None else None
        virtual = list(leases)
        ahead = 0
        if waiting:
            from gpuwarden.leases import waitline  # only with someone in line: run stays cheap

            line = waitline.iter_line(ld, before=mine, tidy=True)
        else:
            line = iter(())
        for w in line:
            ahead += 1
            try:
                c = choose(snapshot, w.request, virtual, drains, w.allowed, judgement)
            except UserError:
                continue  # its own problem; it will fail on its next attempt
            if c.never_fits:
                continue
            if not c.ok:
                return Outcome(None, c, ahead, w)
            virtual.extend(_virtual(g.uuid, w, c) for g in c.gpus)
        held = Held(ld, job or new_job_id(), (), request.mem)
        held.spares = spares
        unknown: list[LeaseInfo] = []
        while True:
            choice = choose(snapshot, request, virtual + unknown, drains, allowed, judgement)
            if not choice.ok:
                held.close()
                return Outcome(None, choice, ahead)
            taken = []
            for gpu in choice.gpus:
                try:
                    took = held.take(gpu, shared=request.mem is not None)
                except BaseException:
                    held.release()
                    raise
                if not took:
                    # Locked without visible metadata (a holder killed mid-publish, or
                    # another tool): treat it as leased and choose again.
                    unknown.append(LeaseInfo(gpu.uuid, "unknown", 0, "(no metadata)", 0.0))
                    break
                taken.append(gpu)
            else:
                held.gpus = tuple(taken)
                break
            held.release()
            held = Held(ld, held.job, (), request.mem)
            held.spares = spares
        if ticket is not None:
            ticket.leave()
        held.keep_allocation_lock(alloc_fd)
        alloc_fd = -1
        return Outcome(held, choice, ahead)
    finally:
        if alloc_fd >= 0:
            os.close(alloc_fd)


def _virtual(uuid: str, waiter: Waiter, choice: Choice) -> LeaseInfo:
    # Not a lease yet: the user says so, since a message shows it as "leased by ...".
    return LeaseInfo(
        uuid,
        f"{waiter.user} (waiting in line)",
        waiter.pid,
        "(next in line)",
        waiter.since,
        waiter.request.mem,
    )


def choose_now(
    snapshot: Snapshot,
    request: Request,
    allowed: Optional[Collection[str]],
    conf: Optional[Config] = None,
) -> Choice:
    """What `acquire` would choose now, leasing nothing: the `selection.Choice` against
    the leases and drains of this moment (`conf`: the caller's reading of the
    configuration, None: the one in force)."""
    from gpuwarden import leases
    from gpuwarden.files.locations import lease_location, state_location
    from gpuwarden.health.drain import list_drains
    from gpuwarden.health.xidlog import judged
    from gpuwarden.placement.selection import choose

    drains = list_drains(state_location(conf))
    held = leases.list_leases(lease_location(conf))
    return choose(snapshot, request, held, drains, allowed, judged(snapshot.gpus, conf=conf))


def waiting_count(conf: Optional[Config] = None) -> int:
    """How many requests wait in line (they are served before a new one)."""
    from gpuwarden.files.locations import lease_location
    from gpuwarden.leases import waitline
    from gpuwarden.leases.dir import open_dir

    return len(waitline.read_line(open_dir(lease_location(conf))))


def describe_request(request: Request) -> str:
    from gpuwarden.base.units import format_size

    if request.gpus and request.count is None:
        what = f"GPU {','.join(request.gpus)}"
    else:
        n = 1 if request.count is None else request.count
        what = f"{n} GPU" + ("" if n == 1 else "s")
        if request.gpus:
            what += f" among {','.join(request.gpus)}"
    if request.mig is not None:
        what = what.replace("GPU", f"MIG {request.mig} slice", 1)
    if request.mem is not None:
        what += f" with {format_size(request.mem)} shared"
    elif request.min_free is not None:
        what += f" with {format_size(request.min_free)} free"
    return what


def _refused(out: Outcome, wait: bool) -> str:
    """Why an attempt took nothing, for a waiter's progress; raises where waiting cannot
    help: a request that can never fit, or one that does not wait."""
    choice = out.choice
    if choice.never_fits:
        raise UserError(choice.error or "the request can never fit here")
    reason: str = choice.error or ""
    if out.blocked_by is not None:
        w = out.blocked_by
        reason = f"first in line: {w.user} pid {w.pid} ({describe_request(w.request)})"
    if not wait:
        if out.blocked_by is not None:
            reason = f"requests waiting in line come first; {reason}"
        raise UserError(reason or "no GPU fits now", exit_code=EXIT_BUSY)
    return reason


def acquire(
    request: Request,
    *,
    snapshot: Callable[[], Snapshot],
    wait: bool = False,
    timeout: Optional[float] = None,
    allowed: Optional[Collection[str]] = None,
    job: Optional[str] = None,
    on_wait: Optional[Callable[[int, int, str, float], None]] = None,
    lease_dir: Optional[str] = None,
    poll: float = 0.05,
    refresh: float = 1.0,
    conf: Optional[Config] = None,
) -> Held:
    """Take leases for `request` (the allocation lock stays held until `publish`).

    `snapshot()` reads the machine. Without `wait`, a request that does not fit now
    raises UserError(exit_code=EXIT_BUSY); with it, the caller joins the line and
    `on_wait(position, waiting, reason, elapsed)` reports progress until granted or
    `timeout` seconds pass (EXIT_BUSY too). A request that can never fit raises at
    once.

    Waiting costs little however long the line: a waiter looks at the directory's
    mtime every `poll` seconds (a lease or ticket came or went), then at the ticket
    names (which carry each waiter's GPU count), and reads NVML and takes the
    allocation lock only when the waiters ahead leave room for it. It also re-tries
    every `refresh` seconds (memory freed by processes gpuwarden did not start) and
    checks that the waiters ahead are alive (a killed waiter leaves the line). Both
    periods stretch with the distance from the front of the line.

    `conf` is the caller's reading of the configuration (`gpuwarden run` has it with
    its options): the lease directory unless `lease_dir` names one, the drains' and
    XID logs' directory and the health rules. None: the configuration in force, read
    where each is needed.
    """
    if lease_dir is None and conf is not None:
        from gpuwarden.files.locations import lease_location

        lease_dir = lease_location(conf)
    ld = open_dir(lease_dir)
    start = time.monotonic()
    ticket = None
    last_seen = None
    last_refresh = 0.0
    gpu_count: Optional[int] = None
    reason = ""
    mine = needs(request)
    position, total, slow = 1, 1, 1.0
    try:
        while True:
            now = time.monotonic()
            seen = os.stat(ld.path).st_mtime_ns
            due = now - last_refresh >= refresh * slow
            if ticket is None or seen != last_seen or due:
                last_seen = seen
                hopeless = False
                if ticket is not None:
                    if due:
                        last_refresh = now
                    position, total, ahead_need = ticket.scan(check_alive=due, most=gpu_count)
                    hopeless = gpu_count is not None and ahead_need + mine > gpu_count
                    # Far back in a long line, look less often: nobody there can be
                    # served before those ahead are.
                    slow = min(10.0, max(1.0, position / max(1, gpu_count or 1)))
                if not hopeless:
                    snap = snapshot()
                    gpu_count = len(snap.gpus) if allowed is None else len(allowed)
                    left = 1.0 if timeout is None else max(0.0, timeout - (now - start))
                    patience = min(1.0, left) if wait else ALLOC_PATIENCE
                    try:
                        out = attempt(
                            ld,
                            request,
                            snap,
                            allowed=allowed,
                            job=job,
                            ticket=ticket,
                            patience=patience,
                            conf=conf,
                        )
                    except AllocationBusy as err:
                        if not wait:
                            raise
                        out, reason = None, str(err)
                    if out is not None and out.held is not None:
                        return out.held
                    if out is not None:
                        reason = _refused(out, wait)
                    if ticket is None:
                        from gpuwarden.leases import waitline

                        ticket = waitline.join(ld, request, allowed, mine)
                        last_seen = os.stat(ld.path).st_mtime_ns
                        last_refresh = now
                        position, total, _ = ticket.scan(check_alive=True)
                elif not reason:
                    reason = "the waiters ahead need every GPU"
                if on_wait is not None:
                    on_wait(position, total, reason, now - start)
            if timeout is not None and time.monotonic() - start >= timeout:
                why = f" ({reason})" if reason else ""
                raise UserError(
                    f"timed out after {format_span(timeout)} waiting for "
                    f"{describe_request(request)}{why}",
                    exit_code=EXIT_BUSY,
                )
            time.sleep(poll * slow)
    finally:
        if ticket is not None:
            ticket.leave()
