"""The preemption policy (gpuwarden.planning.preemption) on hand-built queues: who may start on
idle GPUs, and which preemptible jobs give their GPUs back to whom."""

from __future__ import annotations

from gpuwarden.planning import booking, preemption, scheduling
from gpuwarden.planning.scheduling import QueueGpu, Running, Waiting

NOW = 1_000_000.0
GPUS = [QueueGpu(f"G{i}", 80 << 30) for i in range(8)]


def scavenger(i: int, user: str = "alice", ran: float = 100.0, **kw: object) -> Running:
    return Running(f"s{i}", user, (f"G{i}",), NOW - ran, preemptible=True, **kw)  # type: ignore[arg-type]


def test_preemptible_jobs_fill_idle_gpus_beyond_the_users_gpu_limit() -> None:
    policy = scheduling.Policy(max_gpus_per_user=2)
    waiting = [Waiting(f"w{i}", "alice", 1, NOW - 10, preemptible=True) for i in range(10)]
    planned = preemption.plan(GPUS, [], waiting, {}, NOW, policy)
    started = [d for d in planned.decisions if d.starts]
    assert len(started) == 8 and planned.victims == {}
    assert {d.reason for d in planned.decisions if not d.starts} == {scheduling.RESOURCES}
    # A normal job of hers is not held back by them: they count against no limit.
    running = [scavenger(i) for i in range(6)]
    normal = Waiting("n", "alice", 2, NOW)
    planned = preemption.plan(GPUS, running, [normal], {}, NOW, policy)
    assert planned.decisions[0].starts and planned.victims == {}


def test_a_normal_job_preempts_the_fewest_that_lose_least() -> None:
    # Eight one-GPU preemptible jobs; the two youngest lose least.
    running = [scavenger(i, ran=1000.0 - 100 * i) for i in range(8)]
    bob = Waiting("b", "bob", 2, NOW)
    planned = preemption.plan(GPUS, running, [bob], {}, NOW)
    assert not planned.decisions[0].starts
    assert planned.decisions[0].reason == scheduling.RESOURCES
    assert planned.victims == {"s6": "job b", "s7": "job b"}


def test_fewest_victims_beat_less_work_lost() -> None:
    # One 2-GPU job that ran long, or two 1-GPU jobs that ran little: one victim wins.
    running = [
        Running("big", "alice", ("G0", "G1"), NOW - 5000, preemptible=True),
        scavenger(2, ran=10),
        scavenger(3, ran=10),
        *(Running(f"n{i}", "carol", (f"G{i}",), NOW) for i in range(4, 8)),
    ]
    planned = preemption.plan(GPUS, running, [Waiting("b", "bob", 2, NOW)], {}, NOW)
    assert planned.victims == {"big": "job b"}


def test_no_victims_when_preemption_cannot_start_the_job() -> None:
    # Six GPUs held by normal jobs: a 4-GPU job cannot start even with both victims gone.
    running = [
        scavenger(0),
        scavenger(1),
        *(Running(f"n{i}", "c", (f"G{i}",), NOW) for i in range(2, 8)),
    ]
    planned = preemption.plan(GPUS, running, [Waiting("b", "bob", 4, NOW)], {}, NOW)
    assert planned.victims == {}


def test_victims_on_their_way_out_are_not_chosen_twice_and_their_gpus_are_kept() -> None:
    running = [scavenger(i, leaving=i in (6, 7)) for i in range(8)]
    waiting = [
        Waiting("b", "bob", 2, NOW),
        Waiting("again", "alice", 1, NOW - 50, preemptible=True),
    ]
    # G7 was freed already; G6 still on its way out.
    running = [r for r in running if r.id != "s7"]
    planned = preemption.plan(GPUS, running, waiting, {}, NOW)
    assert planned.victims == {}  # the job is served by the one leaving
    by_id = {d.id: d for d in planned.decisions}
    assert not by_id["b"].starts
    assert not by_id["again"].starts  # G7 is kept for b, not taken back by a preemptible job


def test_a_held_or_dependent_normal_job_preempts_nobody() -> None:
    running = [scavenger(i) for i in range(8)]
    waiting = [Waiting("h", "bob", 1, NOW, held=True), Waiting("d", "bob", 1, NOW, after=("x",))]
    planned = preemption.plan(
        GPUS, running, [*waiting, Waiting("x", "bob", 8, NOW, held=True)], {}, NOW
    )
    assert planned.victims == {}


def test_victims_exact_and_greedy_agree_on_counts() -> None:
    state = scheduling.Capacity(GPUS)
    running = [scavenger(i, ran=float(i)) for i in range(8)]
    for r in running:
        state.take(r.gpus, r.mem)
    for need in range(1, 9):
        found = preemption.victims(Waiting("b", "bob", need, NOW), state, running, NOW)
        assert found is not None and len(found) == need
        assert sorted(v.id for v in found) == [f"s{i}" for i in range(need)]  # least run
    assert preemption.victims(Waiting("b", "bob", 9, NOW), state, running, NOW) is None


def test_preemptible_jobs_do_not_make_a_normal_job_wait_for_a_booking() -> None:
    # Four GPUs booked for bob in an hour; carol's preemptible jobs hold four. dave's job
    # without --time starts now on a free GPU: at the window, carol's give theirs back.
    future = booking.Booking(1, 4, NOW + 3600, NOW + 7200, frozenset({"bob"}))
    running = [scavenger(i, user="carol") for i in range(4)]
    planned = preemption.plan(
        GPUS, running, [Waiting("d", "dave", 1, NOW)], {}, NOW, bookings=[future]
    )
    assert planned.decisions[0].starts and planned.victims == {}


def test_preemptible_jobs_use_booked_gpus_until_the_window() -> None:
    future = booking.Booking(1, 4, NOW + 3600, NOW + 7200, frozenset({"bob"}))
    waiting = [Waiting(f"w{i}", "alice", 1, NOW, preemptible=True) for i in range(8)]
    planned = preemption.plan(GPUS, [], waiting, {}, NOW, bookings=[future])
    assert sum(d.starts for d in planned.decisions) == 8  # a normal job without --time: 4
    normal = [Waiting(f"n{i}", "alice", 1, NOW) for i in range(8)]
    assert sum(d.starts for d in scheduling.plan(GPUS, [], normal, {}, NOW, bookings=[future])) == 4
    # The window opens: four of them give their GPUs back, and none starts in their place.
    now = NOW + 3600
    running = [scavenger(i, ran=float(i)) for i in range(8)]
    planned = preemption.plan(GPUS, running, [], {}, now, bookings=[future])
    assert sorted(planned.victims) == ["s0", "s1", "s2", "s3"]
    assert set(planned.victims.values()) == {"booking 1"}
    waiting = [Waiting("again", "alice", 1, now, preemptible=True)]
    left = [r for r in running if r.id not in planned.victims]
    planned = preemption.plan(GPUS, left, waiting, {}, now, bookings=[future])
    assert planned.decisions[0].reason == scheduling.BOOKED
