"""A job's end that the journal could not take yet (its disk full), kept until it can.

When a job ends, what decides the next start is that its GPUs are free, not that the
journal says so. A full disk under the journal must therefore cost nothing but the
record's delay: the end (or a waiting job's cancel) is kept in memory as the write
that failed, the plan leaves the job out at once (its GPUs free, a cancelled waiting
job never started), and the write is tried again on every tick and before every pass
until the disk has room; then the rest of the end (removing its exit record, planning
again) follows. The supervisor's exit record was written into room reserved before the
job started (service.spawn), so a restart meanwhile finds how the job ended, never a
LOST job. A waiting job's cancel kept here is forgotten by a restart before the disk
has room: the job waits again, nothing ran.
"""

from __future__ import annotations

import logging
import sqlite3
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from typing import Protocol

    from gpuwarden.service.pacing import Pacer
    from gpuwarden.service.store import Job, Store

    class Keeping(Protocol):
        """What keeping an end needs of the jobs' life (`joblife.JobLife` has it)."""

        store: Store
        unwritten: dict[int, Callable[[], None]]  # job id -> its end, not yet written
        pacer: Pacer


log = logging.getLogger("gpuwarden.serve")


def write(service: Keeping, job_id: int, change: Callable[[], None]) -> bool:
    """Make the journal's `change` ending job `job_id` now, or keep it for `retry` when
    the journal cannot take it. Inside a caller's transaction the caller decides what
    a failure means: it is raised. True: written."""
    if service.store.db.in_transaction:
        change()
        return True
    try:
        change()
    except sqlite3.Error as err:
        if not service.unwritten:
            log.error("the journal cannot be written (%s); ends are kept until it can", err)
        service.unwritten[job_id] = change
        log.warning("job %s: its end is kept until the journal can take it", job_id)
        return False
    return True


def note(service: Keeping, job_id: int, change: Callable[[], None]) -> None:
    """A change a full disk may lose without harm (why a job waits, that it is being
    cancelled): made now, or logged and dropped. Inside a transaction: raised."""
    if service.store.db.in_transaction:
        change()
        return
    try:
        change()
    except sqlite3.Error as err:
        log.warning("job %s: a change was not written (%s)", job_id, err)


def each(
    service: Keeping, cancel: bool, jobs: Iterable[Job], act: Callable[[Job], None]
) -> list[int]:
    """`act` on each of `jobs` in one commit; the ids it acted on. A cancel the journal
    could not take (its disk full) is made again job by job outside it: a waiting job's
    kept here, a running one signalled (once: service.joblife)."""
    jobs = list(jobs)
    try:
        with service.store.transaction():
            for job in jobs:
                act(job)
        return [job.id for job in jobs]
    except sqlite3.Error:
        if not cancel:
            raise
    for job in jobs:
        act(job)
    return [job.id for job in jobs]


def retry(service: Keeping) -> int:
    """Write the kept ends in the order they came, while the journal takes them; how
    many were written."""
    done = 0
    for job_id, change in list(service.unwritten.items()):
        try:
            change()
        except sqlite3.Error:
            break
        del service.unwritten[job_id]
        done += 1
    if done:
        log.info("%d kept job end(s) written to the journal", done)
        service.pacer.wake()
    return done
