"""A running batch job queued again under its id when it ends: Slurm's `scontrol requeue`.

submitit saves a checkpointable call when its time is nearly up and asks for the job
to be requeued (gpuwarden.submitit); the client keeps watching the same id and reads
the result of the run that finishes. The job's owner asks while it runs (`requeue`),
the service notes it in the job's reason, and when the job ends it waits again instead:
its leases and cgroup go, the GPU-seconds it used are charged, its exit record and
marker are removed before the journal says PENDING (a crash in between finds a
RUNNING job with neither, which a restart queues again, the same outcome).
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from typing import Any

from gpuwarden import scheduling
from gpuwarden.errors import UserError
from gpuwarden.service import accounting, spawn, store

log = logging.getLogger("gpuwarden.serve")

#: The reason a running job shows once its requeue was asked for.
ASKED = "requeue"


def ask(journal: store.Store, job: store.Job) -> None:
    """Mark `job` (its owner's or an admin's, checked by the caller) to run again."""
    if job.state != store.RUNNING:
        raise UserError(f"job {job.id} is {job.state.lower()}: only a running job is requeued")
    if job.attached:
        raise UserError(f"job {job.id} is attached to a terminal: only batch jobs are requeued")
    journal.update(job.id, reason=ASKED)


def asked(job: store.Job) -> bool:
    return job.reason == ASKED


def again(service: Any, job: store.Job, ended: spawn.Ended) -> None:
    """`job` has ended and asked to be requeued: PENDING again, under its id."""
    from gpuwarden.service.placing import release_leases

    dirs = service.job_cgroup(job.id)
    if dirs:
        service._close_cgroup(job.id, dirs)
    release_leases(service, job)
    for path in (
        spawn.exit_record_path(service.exits, str(job.id)),
        spawn.marker_path(service.exits, str(job.id)),
    ):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
    now = time.time()
    memory = max((service.memory.get(u, 0) for u in job.gpus), default=0)
    used = scheduling.job_usage(
        len(job.gpus), (ended.at or now) - (job.started or now), job.mem, memory
    )
    with service.store.transaction():
        service.store.update(
            job.id,
            state=store.PENDING,
            gpus=(),
            started=None,
            supervisor=None,
            pid=None,
            reason=None,
        )
        service.store.charge(job.user, used, now, service.settings.policy.half_life)
        service.ran(job, ended.at or now, accounting.REQUEUED, used)
    service.termed.pop(job.id, None)
    from gpuwarden.service import jobnotify

    jobnotify.send(service.notifier, job, ["REQUEUE"], state=store.PENDING)
    log.info("job %s requeued", job.id)
    service.pacer.wake()
