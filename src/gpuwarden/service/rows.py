"""A job as `queue` and `jobs` answer it, and their pages (service.listing).

A start error or a command line can quote a private path: both are shown to the
job's owner and the admins only, unless `service.show_commands` says otherwise.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from gpuwarden.queueclient import protocol
from gpuwarden.service import arrays, bookings, listing, store
from gpuwarden.service.owners import mine
from gpuwarden.service.reports import usage_now

if TYPE_CHECKING:
    from gpuwarden.service.identity import Person
    from gpuwarden.service.joblife import JobLife


def history(life: JobLife, who: Person, ask: protocol.Listing) -> dict[str, Any]:
    """A page of the history (service.listing): the store skips to the offset and
    stops at the limit, never more than fits in one answer."""
    from gpuwarden.service.accounting import totals

    jobs, total = life.store.history(ask.limit, ask.offset, ask.user, ask.ids)

    def shaped(job: store.Job) -> dict[str, Any]:  # only those the page takes
        shown = row(life, who, job)
        ran = totals(life.store.db, [job.id])  # every run of a requeued job
        if job.id in ran:
            shown["runs"], shown["run_seconds"], shown["gpu_seconds"] = ran[job.id]
        return shown

    return listing.page(jobs, ask, total, shaped)


def queue(
    life: JobLife, who: Person, ask: protocol.Listing, ordered: list[store.Job]
) -> dict[str, Any]:
    """A page of the queue, `ordered` as the plan ranks it (service.listing): never
    more than fits in one answer, however many jobs there are."""
    if ask.arrays:  # an array's waiting tasks in one row (service.arrays)
        rows = arrays.grouped(ordered)
        reply = listing.page(
            rows[ask.offset :],
            ask,
            len(rows),
            lambda r: row(life, who, r[0]) | arrays.row_fields(*r),
        )
    else:
        reply = listing.page(ordered[ask.offset :], ask, len(ordered), lambda j: row(life, who, j))
    return headed(life, reply)


def headed(life: JobLife, reply: dict[str, Any]) -> dict[str, Any]:
    """A page of the queue with what its table's header shows: the GPU use outside
    the queue, the next bookings (at most 10)."""
    reply["unleased"] = life.watcher().unleased
    reply.update(bookings.for_queue(life.bookings(), time.time()))
    return reply


def row(life: JobLife, who: Person, job: store.Job) -> dict[str, Any]:
    """One job as `queue` and `jobs` answer it."""
    show = life.settings.show_commands or life.settings.admins.include(who)
    shown = {
        "id": job.id,
        "user": job.user,
        "account": job.account,
        "state": job.state,
        "count": job.count,
        "gpus": list(job.gpus),
        "indices": [life.queue.indices.get(u) for u in job.gpus],
        "mem": job.mem,
        "reason": job.reason,
        "submitted": job.submitted,
        "started": job.started,
        "ended": job.ended,
        "time_limit": job.time_limit,
        "held": job.held,
        "after": list(job.after),
        "exit_code": job.exit_code,
        "signal": job.exit_signal,
        "preemptible": job.preemptible,
        "restarts": job.restarts,
        "preemptions": job.preemptions,
        # A start error can quote the command or a private path: as the command.
        "error": job.error if show or mine(job, who) else None,
        "priority": life.queue.priorities.get(job.id),
        "estimated_start": (
            life.queue.expected_start(job.id) if job.state == store.PENDING else None
        ),
        "command": listing.command(job.argv) if show or mine(job, who) else None,
    }
    if job.array_job is not None:
        shown.update(arrays.row_fields(job, ()))
    if job.started is not None:
        shown["elapsed"] = (job.ended or time.time()) - job.started
    shown["cpu_seconds"], shown["mem_peak"] = job.cpu_seconds, job.mem_peak
    if job.state == store.RUNNING:
        shown["cpu_seconds"], shown["mem_peak"] = usage_now(life, job.id)
    return shown
