"""A pass of the plan: from the journal and the machine to the jobs that start now.

`schedule` asks `scheduling.plan` (through `preemption.plan`, which adds the
victims a waiting job may preempt) what starts, on service.placing's inputs,
records why each other job waits, and starts what the plan starts
(service.placing) without waiting for any of them to set itself up
(service.starting). A full pass plans and ranks every waiting job, a start pass
the first few that could start (service.ready); service.pacing says which is due.
It is the one writer of what the plan worked out (`JobLife.queue`,
service.queuestate).
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

from gpuwarden.base.errors import UserError
from gpuwarden.planning import preemption
from gpuwarden.service import arrays, bookings, limiting, preempting, starting, store, unwritten

if TYPE_CHECKING:
    from gpuwarden.service.joblife import JobLife

log = logging.getLogger("gpuwarden.serve")


def _plannable(journal: store.Store) -> list[store.Job]:
    """What a full pass plans: every waiting job that is not held, and the held jobs
    those name in `--after` (they wait on them: Dependency). No other held job: it
    cannot start, its reason was said when it was held, and it has no priority until
    it is released (as Slurm's held jobs), so 10,000 held jobs cost a pass nothing."""
    waits = journal.waiting()
    named = {a for j in waits for a in j.after}
    held = (journal.get(i) for i in named)
    waits.extend(j for j in held if j is not None and j.state == store.PENDING and j.held)
    return waits


def schedule(life: JobLife, full: bool = True) -> None:
    """Plan and start what the plan starts, keeping what stays free (`free`) for a submit
    to judge (service.pacing): a full pass plans and ranks every waiting job, a start
    pass the first few that could start (service.ready), both on service.machine's."""
    from gpuwarden.placement.mig import devices
    from gpuwarden.service.placing import go, inputs, record_reasons, start_job

    began = time.monotonic()
    unwritten.retry(life)  # ends a full disk kept, written once it has room
    # An attached job whose client has not come back after a restart waits for it.
    waits, more = (_plannable(life.store), False) if full else life.store.ready()
    kept = life.unwritten  # ended or cancelled, not yet in the journal: left out
    pending = [
        j for j in waits if (not j.attached or j.id in life.attachments.stdio) and j.id not in kept
    ]
    if not pending:
        life.queue.nothing_waits(full)  # after a full pass: a submit plans at once
        return life.pacer.planned("full" if full else "start", began, time.monotonic())
    # One reading of the configuration for the pass, handed to what it calls: drains,
    # XID logs and health rules change without a reload (read again when its files
    # change: service.liveconfig).
    reading = life.reading = life.live.current()
    snapshot = life.hardware.current(life.settings.tick)
    units = devices(snapshot)  # MIG slices in place of their GPU: what jobs are given
    life.queue.seen(units)
    running = [j for j in life.store.jobs([store.STARTING, store.RUNNING]) if j.id not in kept]
    pending, throttled = arrays.throttled(pending, running)
    # Only the dependencies waiting jobs name: reading every ended job made each
    # pass grow with the history.
    named = life.store.states(a for j in pending for a in j.after)
    ended = {i: state == store.COMPLETED for i, state in named.items() if state in store.ENDED}
    now = time.time()
    leaving = {*life.termed, *life.preempting}
    gpus, busy, waiting, pick = inputs(
        snapshot,
        running,
        pending,
        life.settings,
        reading,
        leaving,
        life.hardware.linked,
        life.hardware,
    )
    usage = life.store.usage(now, life.settings.policy.half_life)
    policy = limiting.plan_policy(life.settings, life.store, (*pending, *running))
    decisions, victims = preemption.plan(
        gpus,
        busy,
        waiting,
        usage,
        now,
        policy,
        finished={str(k): v for k, v in ended.items()},
        pick=pick,
        bookings=bookings.for_plan(
            life.bookings().current(now), {j.user for j in (*pending, *running)}
        ),
    )
    for why in set(victims.values()):  # first: their grace runs from now
        chosen = (life.store.get(int(v)) for v, w in victims.items() if w == why)
        preempting.preempt(life, [j for j in chosen if j is not None], why)
    by_id = {j.id: j for j in pending}
    mem = {i: j.mem for i, j in by_id.items()}
    life.queue.planned(full, gpus, busy, waiting, decisions, now, mem)
    if full:
        life.store.rank(life.queue.priorities)  # the order the next start passes take
    record_reasons(life.store, throttled, decisions, by_id)
    if more:  # what waits beyond the first few may fit: a full pass plans it soon
        life.pacer.touch()
    life.pacer.planned("full" if full else "start", began, time.monotonic(), len(waiting))
    started: list[starting.Starting] = []  # their go-aheads wait for one fsync
    try:
        for decision in decisions:
            job = by_id[int(decision.id)]
            if not decision.starts:
                if not job.wait:
                    life.refuse(job, decision.reason or "")
                continue
            if not full:
                life.pacer.touch()  # what `queue` shows of the others moved: refreshed soon
            try:
                start = start_job(life, job, decision.gpus, snapshot, reading)
            except UserError as err:
                starting.failed(life, job.id, err)
                continue
            if start is not None:  # its report comes as an event of the loop
                started.append(start)
    finally:  # the pass's STARTING records made durable at once, then the go-aheads
        go(life, started)
