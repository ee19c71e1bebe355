"""When each waiting job is expected to start, as `squeue --start` says: every job the
resources (or higher-priority jobs) hold back gets a time, not only the first.

The plan (`scheduling.plan`) reserves GPUs for one job; this looks further: it takes
the waiting jobs in the plan's order and puts each, on paper, at the first moment the
GPUs it needs are free for its whole `--time`, given the running jobs (to their time
limits) and the waiting jobs put before it. A job behind one without a `--time`, or
whose GPUs only a job without one frees, gets no time (None): nobody can say.
Held jobs, dependencies, limits and drains get none either: they wait on people, not
on GPUs. Pure: the service gives the plan's inputs and decisions.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import NamedTuple, Optional

from gpuwarden.planning.scheduling import (
    PRIORITY,
    RESOURCES,
    Capacity,
    Decision,
    QueueGpu,
    Running,
    Waiting,
)

#: Waiting jobs given a time, in the plan's order: the work grows with the square of
#: the queue, and a start hundreds of jobs away is a guess anyway.
LOOKAHEAD = 300


class Booked(NamedTuple):
    """GPUs taken from `start` to `end` (a running job, or a waiting one on paper)."""

    start: float
    end: float
    gpus: tuple[str, ...]
    mem: Optional[int]


def estimated_starts(
    gpus: Sequence[QueueGpu],
    running: Iterable[Running],
    waiting: Mapping[str, Waiting],
    decisions: Sequence[Decision],
    now: float,
) -> dict[str, Optional[float]]:
    """Job id -> its estimated start (`now` for one that starts now), for every
    decision, in the plan's order (highest priority first)."""
    booked = [Booked(now, r.ends, r.gpus, r.mem) for r in running]
    out: dict[str, Optional[float]] = {}
    for decision in decisions[:LOOKAHEAD]:
        job = waiting.get(decision.id)
        if job is None:
            continue
        ends = math.inf if job.time_limit is None else job.time_limit
        if decision.starts:
            booked.append(Booked(now, now + ends, decision.gpus, job.mem))
            out[decision.id] = now
            continue
        if decision.reason not in (RESOURCES, PRIORITY):
            out[decision.id] = None
            continue
        out[decision.id] = None
        moments = sorted({now, *(b.end for b in booked if now < b.end < math.inf)})
        for moment in moments:
            chosen = _free_at(gpus, booked, moment).place(job)
            if chosen is None or _collides(booked, moment, moment + ends, chosen, job.mem, gpus):
                continue
            booked.append(Booked(moment, moment + ends, chosen, job.mem))
            out[decision.id] = moment
            break
    return out


def _free_at(gpus: Sequence[QueueGpu], booked: Sequence[Booked], moment: float) -> Capacity:
    free = Capacity(gpus)
    for b in booked:
        if b.start <= moment < b.end:
            free.take(b.gpus, b.mem)
    return free


def _collides(
    booked: Sequence[Booked],
    start: float,
    end: float,
    chosen: tuple[str, ...],
    mem: Optional[int],
    gpus: Sequence[QueueGpu],
) -> bool:
    """Whether a job on `chosen` from `start` to `end` overlaps a booking that begins
    later on the same GPUs and that it would not fit beside."""
    for b in booked:
        if start < b.start < end and set(b.gpus) & set(chosen):
            if mem is None or b.mem is None:
                return True
            size = {g.uuid: g.memory for g in gpus}
            if any(mem + b.mem > size.get(u, 0) for u in set(b.gpus) & set(chosen)):
                return True
    return False
