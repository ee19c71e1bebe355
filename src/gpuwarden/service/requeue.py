"""A batch job queued again under its id: Slurm's `scontrol requeue`, `--max-retries`,
and a preempted job's next run.

Three ways in. Its owner or an admin asks (`gpuwarden requeue ID`, or submitit, whose
checkpointable call asks from inside the job when its time is nearly up): a running
job gets SIGTERM (SIGKILL after the grace) and waits again once it has ended; an ended
one waits again at once. A job submitted with `--max-retries N` that fails (its exit
status not 0, not cancelled, not past its time) waits again, at most N times, each
after a longer pause (`service.retry_backoff`, doubled each time: reason BeginTime).
A preempted job with `--preempt=requeue` waits again (service.preempting).

Each time its GPUs and cgroup go, the GPU-seconds it used are charged, and its exit
record and marker are removed before the journal says PENDING (a crash in between finds
a RUNNING job with neither, which a restart queues again, the same outcome). It keeps
its id, its submit time (so its priority) and its output file, which the next run
appends to; `restarts` counts the runs before, given to the job as
GPUWARDEN_RESTART_COUNT (Slurm's SLURM_RESTART_COUNT).
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import time
from typing import TYPE_CHECKING, Any, Optional

from gpuwarden.base.errors import UserError
from gpuwarden.planning import scheduling
from gpuwarden.service import accounting, exitrecord, spawn, store, unwritten

if TYPE_CHECKING:
    from typing import Protocol

    from gpuwarden.service.notify import JobNotifier
    from gpuwarden.service.placing import PlacingService
    from gpuwarden.service.queuestate import QueueState
    from gpuwarden.service.store import Job
    from gpuwarden.service.unwritten import Keeping

    class RequeueService(PlacingService, Keeping, Protocol):
        """What queueing a job again needs of the jobs' life (`joblife.JobLife` has it)."""

        queue: QueueState
        notifier: JobNotifier
        termed: dict[int, float]  # job id -> when SIGTERM was sent for it
        litter: list[str]  # files of ended jobs, removed after the next start

        def signal(self, job: Job, sig: int) -> bool: ...

        def job_cgroup(self, job_id: int) -> dict[str, str]: ...

        def close_cgroup(self, job_id: int, dirs: dict[str, str]) -> None: ...

        def ran(self, job: Job, ended: float, state: str, gpu_seconds: float) -> None: ...


log = logging.getLogger("gpuwarden.serve")

#: The reason a running job shows once its requeue was asked for.
ASKED = "requeue"
#: The longest pause before a retry, however many came before.
LONGEST_BACKOFF = 3600.0


def ask(service: RequeueService, job: store.Job) -> None:
    """Queue `job` (its owner's or an admin's, checked by the caller) again: a running
    one once SIGTERM (then SIGKILL after the grace) has ended it, an ended one now."""
    if job.attached:
        raise UserError(f"job {job.id} is attached to a terminal: only batch jobs are requeued")
    if job.state in store.ENDED:
        with service.store.transaction():
            service.store.update(
                job.id, **_waiting_again(job), ended=None, exit_code=None, exit_signal=None
            )
        # Its last run's records go now (the commit above is durable): a restart must
        # not take them for the next run's.
        for path in _records(service, job):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
            with contextlib.suppress(ValueError):
                service.litter.remove(path)
        log.info("job %s requeued after it ended (%s)", job.id, job.state)
        service.pacer.wake()
        return
    if job.state != store.RUNNING:
        raise UserError(f"job {job.id} is {job.state.lower()}: it is not running nor ended")
    service.store.update(job.id, reason=ASKED)
    if job.pid and job.id not in service.termed:
        service.signal(job, signal.SIGTERM)
        service.termed[job.id] = time.monotonic()


def asked(job: store.Job) -> bool:
    return job.reason == ASKED


def retrying(job: store.Job) -> bool:
    """Whether a failed `job` has a retry left (`--max-retries`)."""
    return job.retries < int(job.request.get("max_retries") or 0)


def backoff(base: float, retries: int) -> float:
    """The pause before retry number `retries + 1`: `base`, doubled each time."""
    return float(min(LONGEST_BACKOFF, base * 2.0 ** min(retries, 30)))


def _records(service: RequeueService, job: store.Job) -> tuple[str, str]:
    """The exit record and the marker of `job`'s last run."""
    return (
        exitrecord.exit_record_path(service.exits, str(job.id)),
        spawn.marker_path(service.exits, str(job.id)),
    )


def _waiting_again(job: store.Job) -> dict[str, Any]:
    """The journal's columns of `job` waiting again after a run."""
    return {
        "state": store.PENDING,
        "gpus": (),
        "started": None,
        "supervisor": None,
        "pid": None,
        "reason": None,
        "restarts": job.restarts + 1,
    }


def again(
    service: RequeueService,
    job: store.Job,
    ended: exitrecord.Ended,
    *,
    retry: bool = False,
    preempted: bool = False,
    charge: float = 1.0,
) -> None:
    """`job` has ended and runs again: PENDING under its id. `retry`: after a failure
    (it waits `backoff`); `preempted`: after preemption. `charge`: the factor its
    GPU-seconds count at (a preemptible job's, service.preempting)."""
    from gpuwarden.service.placing import release_leases

    dirs = service.job_cgroup(job.id)
    if dirs:
        service.close_cgroup(job.id, dirs)
    release_leases(service, job)
    for path in _records(service, job):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
    now = time.time()
    memory = service.queue.gpu_memory(job.gpus)
    used = scheduling.job_usage(
        len(job.gpus), (ended.at or now) - (job.started or now), job.mem, memory
    )
    changes = _waiting_again(job)
    begin: Optional[float] = None
    if retry:
        begin = now + backoff(service.settings.retry_backoff, job.retries)
        changes.update(retries=job.retries + 1, begin=begin)
    if preempted:
        changes["preemptions"] = job.preemptions + 1
    state = "PREEMPTED" if preempted else store.FAILED if retry else accounting.REQUEUED

    def record() -> None:
        with service.store.transaction():
            service.store.update(job.id, **changes)
            service.store.charge(job.user, used * charge, now, service.settings.policy.half_life)
            service.ran(job, ended.at or now, state, used)  # its GPU-hours held, uncharged

    unwritten.write(service, job.id, record)  # a full disk: kept until it has room
    service.termed.pop(job.id, None)
    from gpuwarden.service import jobnotify

    jobnotify.send(service.notifier, job, ["REQUEUE"], state=store.PENDING)
    if retry:
        log.info(
            "job %s failed (%s); retry %d of %s in %.0fs",
            job.id,
            ended.error or f"exit {ended.code}, signal {ended.signal}",
            job.retries + 1,
            job.request.get("max_retries"),
            (begin or now) - now,
        )
    else:
        log.info("job %s requeued%s", job.id, " after preemption" if preempted else "")
    service.pacer.wake()
