"""Preemptible jobs: on GPUs nobody else can use now, and given back within the grace
when someone can — pure functions over the plan's records.

As a Slurm scavenger QOS with PreemptMode=REQUEUE: a job submitted `--preemptible`
is planned after every normal job, on what they left free, beyond its owner's GPU
limit and on booked GPUs before their window. A normal job that the plan would start
if no preemptible job held GPUs (`scheduling.plan` without them says so, with every
rule of priority, backfill, limits and bookings) gets its GPUs by preemption: the
victims are the fewest preemptible jobs whose GPUs let it start, and among as few,
those whose runs lose least (GPUs x seconds run). A booking in force whose audience
could not find its GPUs free of others' jobs takes them back the same way. Until the
victims have ended, their GPUs and the free ones the waiting job will need are kept
from other preemptible jobs, and no second set of victims is chosen for it.

The service signals the victims, kills them after the grace, and queues them again
(service.preempting); `plan` only names them.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Mapping, Sequence
from typing import NamedTuple, Optional

from gpuwarden.planning import booking, fairshare, scheduling
from gpuwarden.planning.scheduling import Capacity, Decision, Running, Waiting

#: Sets of victims tried one by one before a greedy choice (combinations of a size).
EXACT_TRIES = 2000
#: Reasons of a normal job that preemption may end: it waits for GPUs alone.
FOR_GPUS = (scheduling.RESOURCES, scheduling.PRIORITY, scheduling.BOOKED)


class Plan(NamedTuple):
    """The decisions for every waiting job (normal ones first, each kind by priority),
    and the running jobs to preempt: id -> what needs their GPUs (`job 12`, `booking 3`)."""

    decisions: list[Decision]
    victims: dict[str, str]


def lost(job: Running, now: float) -> float:
    """The work a preempted `job` loses, at most: its GPUs times the seconds it ran."""
    return len(job.gpus) * max(0.0, now - job.started)


def victims(
    job: Waiting, state: Capacity, candidates: Sequence[Running], now: float
) -> Optional[tuple[Running, ...]]:
    """The fewest of `candidates` whose GPUs, given back to `state`, let `job` start, and
    among as few the ones that lose least; () when it fits already, None when even all
    of them would not do. Exact while the sets of a size are few, greedy beyond."""
    if state.place(job) is not None:
        return ()
    useful = [c for c in candidates if job.eligible is None or set(c.gpus) & job.eligible]
    if not _fits_without(job, state, useful):
        return None
    useful.sort(key=lambda c: (lost(c, now), c.id))
    for size in range(1, len(useful) + 1):
        if math.comb(len(useful), size) > EXACT_TRIES:
            break
        best: Optional[tuple[Running, ...]] = None
        for group in itertools.combinations(useful, size):
            cost = sum(lost(c, now) for c in group)
            if (best is None or cost < sum(lost(c, now) for c in best)) and _fits_without(
                job, state, group
            ):
                best = group
        if best is not None:
            return best
    # Greedy: the most useful GPUs first, then least lost; then drop any not needed.
    chosen: list[Running] = []
    for candidate in sorted(useful, key=lambda c: (-_useful_gpus(job, c), lost(c, now))):
        chosen.append(candidate)
        if _fits_without(job, state, chosen):
            break
    for candidate in sorted(chosen, key=lambda c: -lost(c, now)):
        rest = [c for c in chosen if c is not candidate]
        if _fits_without(job, state, rest):
            chosen = rest
    return tuple(chosen)


def _useful_gpus(job: Waiting, candidate: Running) -> int:
    return len(candidate.gpus if job.eligible is None else set(candidate.gpus) & job.eligible)


def _fits_without(job: Waiting, state: Capacity, gone: Sequence[Running]) -> bool:
    trial = state.copy()
    for other in gone:
        trial.take(other.gpus, other.mem, -1)
    return trial.place(job) is not None


def booked(
    now: float,
    bookings: Sequence[booking.Booking],
    usable: int,
    running: Sequence[Running],
    candidates: Sequence[Running],
) -> dict[str, str]:
    """Preemptible jobs to end so that the bookings in force find their GPUs free of
    everyone outside their audiences (`booking.blocking`'s count), least lost first."""
    force = booking.in_force(bookings, now)
    if not force:
        return {}
    audience = frozenset().union(*(b.users for b in force))
    need = sum(b.count for b in force)
    outsiders = [r for r in running if r.user not in audience and not r.leaving]
    taken = {g for r in outsiders for g in r.gpus}
    out: dict[str, str] = {}
    why = "booking " + ", ".join(str(b.id) for b in force)
    for victim in sorted(
        (c for c in candidates if c.user not in audience), key=lambda c: (lost(c, now), c.id)
    ):
        if usable - len(taken) >= need:
            break
        out[victim.id] = why
        taken = {g for r in outsiders if r.id not in out for g in r.gpus}
    return out


def plan(
    gpus: Sequence[scheduling.QueueGpu],
    running: Sequence[Running],
    waiting: Sequence[Waiting],
    usage: Mapping[str, float],
    now: float,
    policy: Optional[scheduling.Policy] = None,
    finished: Optional[Mapping[str, bool]] = None,
    pick: Optional[scheduling.Pick] = None,
    bookings: Sequence[booking.Booking] = (),
) -> Plan:
    """`scheduling.plan` for the normal jobs, the victims their GPUs need, then the
    preemptible jobs on what is left (arguments as `scheduling.plan`'s)."""
    policy = scheduling.Policy() if policy is None else policy
    scavengers = [w for w in waiting if w.preemptible]
    normal: Sequence[Waiting] = [w for w in waiting if not w.preemptible] if scavengers else waiting
    decisions = scheduling.plan(gpus, running, normal, usage, now, policy, finished, pick, bookings)
    yielding = [r for r in running if r.preemptible]
    if not scavengers and not yielding:
        return Plan(decisions, {})
    by_id = {w.id: w for w in waiting}
    state = Capacity(gpus)
    for run in running:
        state.take(run.gpus, run.mem)
    for decision in decisions:
        if decision.starts:
            state.take(decision.gpus, by_id[decision.id].mem)
    going = state.copy()  # and once every job told to end has ended
    for run in running:
        if run.leaving:
            going.take(run.gpus, run.mem, -1)
    chosen: dict[str, str] = {}
    kept: set[str] = set()  # free GPUs a normal job waits for, beside its victims'
    candidates = [r for r in yielding if not r.leaving]
    if candidates and any(not d.starts and d.reason in FOR_GPUS for d in decisions):
        others = [r for r in running if not r.preemptible]
        alone = scheduling.plan(gpus, others, normal, usage, now, policy, finished, None, bookings)
        would = {d.id for d in alone if d.starts} - {d.id for d in decisions if d.starts}
        for decision in decisions:  # by priority
            job = by_id[decision.id]
            if decision.id not in would:
                continue
            found = victims(job, going, candidates, now)
            if found is None:
                continue
            for victim in found:
                going.take(victim.gpus, victim.mem, -1)
                candidates.remove(victim)
                chosen[victim.id] = f"job {job.id}"
            got = going.place(job)
            if got is not None:
                going.take(got, job.mem)
                kept.update(got)
    if candidates and bookings:
        usable = sum(1 for g in gpus if g.usable)
        left = [r for r in candidates if r.id not in chosen]
        gone = [r._replace(leaving=True) if r.id in chosen else r for r in running]
        chosen.update(booked(now, bookings, usable, gone, left))
    return Plan(
        decisions
        + _scavenge(
            scavengers,
            state,
            kept,
            running,
            decisions,
            now,
            usage,
            policy,
            finished,
            pick,
            bookings,
        ),
        chosen,
    )


def _scavenge(
    scavengers: Sequence[Waiting],
    state: Capacity,
    kept: set[str],
    running: Sequence[Running],
    decisions: Sequence[Decision],
    now: float,
    usage: Mapping[str, float],
    policy: scheduling.Policy,
    finished: Optional[Mapping[str, bool]],
    pick: Optional[scheduling.Pick],
    bookings: Sequence[booking.Booking],
) -> list[Decision]:
    """The preemptible jobs, by priority, on the GPUs free now and kept for nobody:
    first come first fit, beyond any user's GPU limit, and on booked GPUs outside
    a booking's window."""
    if not scavengers:
        return []
    free = state.copy()
    for uuid in kept:
        if free.whole.get(uuid) == 0 and free.shared.get(uuid) == 0:
            free.take((uuid,), None)
    unbound = dataclasses.replace(policy, max_gpus_per_user=None, gpu_caps={}, account_caps={})
    pending = {w.id for w in scavengers} | {d.id for d in decisions if not d.starts}
    active = {r.id for r in running} | {d.id for d in decisions if d.starts}
    holders = [booking.Holder(r.user, r.gpus, math.inf) for r in running if not r.leaving]
    usable = len(free.order)
    moment = math.nextafter(now, math.inf)  # it may be preempted at any time after now
    factors = fairshare.job_factors({(w.user, w.account) for w in scavengers}, usage, policy)
    ranked = sorted(
        (
            (scheduling.priority(w, now, factors[(w.user, w.account)], policy), w)
            for w in scavengers
        ),
        key=lambda pw: (-pw[0], pw[1].submitted, len(pw[1].id), pw[1].id),
    )
    out = []
    for prio, job in ranked:
        reason = scheduling.blocked(job, pending, active, finished or {}, free, {}, unbound)
        if reason is None and job.begin is not None and job.begin > now:
            reason = scheduling.BEGIN_TIME
        got = free.place(job, frozenset(), pick) if reason is None else None
        if got is not None and booking.blocking(
            job.user, moment, got, now, bookings, usable, holders
        ):
            reason, got = scheduling.BOOKED, None
        if got is None:
            out.append(Decision(job.id, prio, reason=reason or scheduling.RESOURCES))
            continue
        free.take(got, job.mem)
        holders.append(booking.Holder(job.user, got, math.inf))
        out.append(Decision(job.id, prio, gpus=got))
    return out
