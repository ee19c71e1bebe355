"""service.ready: what a start pass plans is a bounded slice of the waiting jobs, first
by the last full pass's priorities, whatever the queue's length."""

from __future__ import annotations

from dataclasses import dataclass

from gpuwarden.service.ready import DEPTH, Ready


@dataclass(frozen=True)
class Job:
    id: int
    submitted: float = 0.0
    after: tuple[int, ...] = ()


def nothing_active(job: Job) -> int:
    return 0


def test_a_pass_over_10000_waiting_jobs_looks_at_a_bounded_slice_first_by_priority() -> None:
    ready = Ready(Job(i) for i in range(1, 10_001))
    ready.rank({i: -float(i % 997) for i in range(1, 10_001)})  # a full pass's priorities
    ready.keep(Job(20_000))  # submitted since
    chosen, more = ready.top(nothing_active)
    assert more
    assert len(chosen) == DEPTH + 1 and 20_000 in {j.id for j in chosen}
    best = sorted(range(1, 10_001), key=lambda i: (i % 997, i))[:DEPTH]
    assert sorted(j.id for j in chosen if j.id != 20_000) == sorted(best)
    assert ready.scanned <= DEPTH + 2
    started = {j.id for j in chosen[:4]}
    for job_id in started:  # they start: the next pass moves on, paying for each once
        ready.drop(job_id)
    before = ready.scanned
    again, _ = ready.top(nothing_active)
    assert not started & {j.id for j in again} and len(again) >= DEPTH
    assert ready.scanned - before <= DEPTH + 4 + 2


def test_held_started_and_requeued_jobs_leave_and_come_back() -> None:
    ready = Ready([Job(1), Job(2), Job(3)])
    ready.rank({1: 3.0, 2: 2.0, 3: 1.0})
    ready.drop(2)  # held
    assert [j.id for j in ready.top(nothing_active, depth=2)[0]] == [1, 3]
    ready.keep(Job(2))  # released: fresh, planned beside the ranked ones
    chosen, more = ready.top(nothing_active, depth=1)
    assert [j.id for j in chosen] == [1, 2] and more
    assert len(ready) == 3


def test_a_job_waiting_on_an_active_one_is_set_aside_until_that_one_ends() -> None:
    active = {7}

    def waits_on(job: Job) -> int:
        return next((a for a in job.after if a in active), 0)

    ready = Ready([Job(1, after=(7,)), Job(2)])
    assert [j.id for j in ready.top(waits_on)[0]] == [2]
    scanned = ready.scanned
    assert [j.id for j in ready.top(waits_on)[0]] == [2]
    assert ready.scanned - scanned == 1  # the dependent one is not looked at again
    active.clear()
    ready.ended(7)
    assert [j.id for j in ready.top(waits_on)[0]] == [1, 2]
