"""A restarted service finds its jobs again, after a stop, a crash or a `kill -9`.

A job's supervisor outlives the service (service.spawn): its exit record says how the
job ended, its marker that it had the go-ahead. So a restart adopts the supervisors
still running, ends the jobs whose record is there, queues again a job that never
started, and waits a while for each attached job's client to come back (`attach`),
ending the job once it is known dead or does not come back. Over the jobs' life
(service.joblife).
"""

from __future__ import annotations

import logging
import time
from functools import partial
from typing import TYPE_CHECKING

from gpuwarden.service import (
    attachment,
    boots,
    exitrecord,
    litter,
    preempting,
    requeue,
    spawn,
    staging,
    store,
    unwritten,
)

if TYPE_CHECKING:
    from gpuwarden.service.joblife import JobLife

log = logging.getLogger("gpuwarden.serve")


def recover(life: JobLife) -> None:
    """Find every job of the journal again after a start, a crash or a `kill -9`.

    A STARTING job whose supervisor was never recorded never got the go-ahead: its
    supervisor (if one was forked) exits without running it, so it is queued again.
    A recorded supervisor still alive is watched; when it ends, its exit record
    says how the job ended, and its absence with no marker means it never started,
    unless the job started in an earlier boot, whose crash may have lost its marker
    (service.boots): it may have run, and ends LOST.
    """
    now = boots.current()
    earlier = boots.earlier(life.store, now)
    for job in life.store.jobs([store.STARTING, store.RUNNING]):
        marker = spawn.read_marker(life.exits, str(job.id))
        ended = exitrecord.read_exit_record(life.exits, str(job.id))
        if ended is not None:
            life.finish(job, ended)
        elif (
            job.supervisor
            and spawn.start_time(job.supervisor) >= 0
            and (
                marker is None or spawn.alive(marker.get("supervisor", 0), marker.get("since", -1))
            )
        ):
            pid = (marker or {}).get("pid") or job.pid
            if job.state == store.STARTING and pid:  # it ran while no service read its report
                running = partial(life.store.update, job.id, state=store.RUNNING, pid=pid)
                unwritten.note(life, job.id, running)
            elif job.state == store.STARTING:  # still setting itself up: its pid comes later
                life.starts.adopted.add(job.id)
            else:
                unwritten.note(life, job.id, partial(life.store.update, job.id, pid=pid))
            life.watch_supervisor(job.id, job.supervisor, pid)
            if job.reason in ("time limit", "cancelling", requeue.ASKED):  # not again
                life.termed[job.id] = time.monotonic()
            elif job.reason == preempting.REASON:  # its signal went: SIGKILL after grace
                life.preempting[job.id] = time.monotonic()
            log.info("re-adopted job %s", job.id)
        elif marker is None and not earlier:
            life.requeue_unstarted(job)
        else:
            why = "the machine went down as it started" if marker is None else "its supervisor died"
            life.finish(job, exitrecord.Ended(None, None, why, time.time()), store.LOST)
    for job in life.store.jobs(store.ACTIVE):
        if not job.attached:
            continue
        # Its client reconnects (`attach`) unless it died meanwhile, or never learnt
        # the job's number (a submit recorded, its answer not sent: not started).
        client = attachment.read_client(life.exits, str(job.id))
        if client is None and job.state == store.PENDING:
            life.store.update(
                job.id,
                state=store.CANCELLED,
                ended=time.time(),
                error="the service restarted before it answered the submit",
            )
            continue
        client = client or attachment.ClientProcess(0, -1)
        life.attachments.orphans[job.id] = (
            time.monotonic() + attachment.REATTACH_WITHIN,
            client,
        )
    boots.record(life.store, now)  # after the changes above: with them on disk
    life.sweep_cgroups()
    _litter_of_ended_jobs(life)
    life.pacer.wake()


def end_orphans(life: JobLife) -> None:
    """Attached jobs whose client has not come back after a restart: ended once the
    client is known dead, or after `REATTACH_WITHIN` (its client gave up before)."""
    for job_id, why in attachment.gone(
        life.attachments.orphans, life.attachments.attached, time.monotonic()
    ):
        job = life.store.get(job_id)
        if job is not None and job.state in store.ACTIVE:
            log.info("job %s: its attached client %s after a restart; cancelling", job_id, why)
            life.cancel(job)


def _litter_of_ended_jobs(life: JobLife) -> None:
    """Exit records and markers of jobs the journal has ended (a service killed
    before `remove_litter` leaves them), and what supervisors that died made for a
    job before it ran (service.staging): removed."""
    life.litter.extend(litter.left_by_ended(life.exits, (j.id for j in life.store.jobs())))
    life.litter.extend(staging.left_by_dead(life.exits, spawn.alive))
    life.remove_litter()
