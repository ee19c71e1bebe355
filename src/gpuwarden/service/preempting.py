"""Preemptible jobs giving their GPUs back: Slurm's PreemptMode=REQUEUE (or CANCEL)
with its GraceTime, on the service's side.

The plan names the victims (gpuwarden.planning.preemption, pure). Each gets its `--signal`
once (SIGTERM when it named none; with `B:`, its first process only), the line
`gpuwarden: job N preempted ...` in its output, and SIGKILL `service.preempt_grace`
seconds later if it is still there. When it has ended it waits again under its id
(`--preempt=requeue`, the default: PREEMPTED, then PENDING with its priority, and
GPUWARDEN_RESTART_COUNT one more) or ends PREEMPTED (`--preempt=cancel`). Its reason,
`preempted`, is in the journal, so a restarted service sends the signal no second
time, and kills a victim still there a grace after it is back.
"""

from __future__ import annotations

import contextlib
import logging
import signal
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Optional

from gpuwarden.service import jobprocess, store
from gpuwarden.service.settings import Settings

if TYPE_CHECKING:
    from typing import Protocol

    from gpuwarden.service.store import Job

    class PreemptingService(Protocol):
        """What preempting a job needs of the jobs' life (`joblife.JobLife` has it)."""

        settings: Settings
        store: store.Store
        processes: dict[int, int]  # job id -> pidfd of its first process
        preempting: dict[int, float]  # job id -> when its preemption signal went
        preempted: dict[str, int]
        next_tick: float

        def signal(self, job: Job, sig: int) -> bool: ...


log = logging.getLogger("gpuwarden.serve")

#: The reason a running job shows from its preemption until it has ended.
REASON = "preempted"


def charge(settings: Settings, job: store.Job) -> float:
    """The factor `job`'s GPU-seconds count at in fair share (`service.preempt_charge`
    for a preemptible job)."""
    return settings.preempt_charge if job.preemptible else 1.0


def preempt(service: PreemptingService, victims: Sequence[store.Job], why: str) -> None:
    """Preempt `victims` for `why` (the job or booking that needs their GPUs)."""
    grace = service.settings.preempt_grace
    victims = [j for j in victims if j.id not in service.preempting and j.pid]
    # Journaled before any signal, in one commit: a service killed in between finds
    # them preempted, and kills them after the grace without signalling them twice.
    with service.store.transaction():
        for job in victims:
            service.store.update(job.id, reason=REASON)
    for job in victims:
        warning = job.request.get("signal")
        number, batch = (int(warning[0]), bool(warning[2])) if warning else (signal.SIGTERM, False)
        pidfd = service.processes.get(job.id)
        if batch and pidfd is not None and not jobprocess.exited(pidfd):
            with contextlib.suppress(ProcessLookupError):
                signal.pidfd_send_signal(pidfd, number)
        else:
            service.signal(job, number)
        service.preempting[job.id] = time.monotonic()
        service.preempted[job.user] = service.preempted.get(job.user, 0) + 1
        log.info(
            "job %s preempted for %s: signal %d, SIGKILL in %gs if still running",
            job.id,
            why,
            number,
            grace,
        )
    # The loop's next tick comes at the grace's end, to kill on time.
    service.next_tick = min(service.next_tick, time.monotonic() + grace)
    for job in victims:  # after every signal: a fork per line, off their way
        if job.output and not job.attached:
            from gpuwarden.service.watching import append_as

            stamp = time.strftime("%Y-%m-%dT%H:%M:%S")
            append_as(job, f"gpuwarden: job {job.id} preempted at {stamp} for {why}\n")


def kill_overdue(service: PreemptingService) -> None:
    """SIGKILL to every preempted job still running past the grace."""
    if not service.preempting:
        return
    now = time.monotonic()
    grace = service.settings.preempt_grace
    for job_id, since in list(service.preempting.items()):
        if now - since < grace:
            service.next_tick = min(service.next_tick, since + grace)
            continue
        job = service.store.get(job_id)
        if job is None or job.state not in (store.STARTING, store.RUNNING):
            service.preempting.pop(job_id, None)
        elif job.pid:
            service.signal(job, signal.SIGKILL)


def ended(service: PreemptingService, job: store.Job) -> Optional[str]:
    """What preemption does to `job`, which has just ended: `requeue`, `cancel`, or
    None when it was not preempted (or was cancelled meanwhile: cancelled it stays)."""
    was = service.preempting.pop(job.id, None) is not None or job.reason == REASON
    if not was or job.reason == "cancelling":
        return None
    return str(job.request.get("preempt") or "requeue")
