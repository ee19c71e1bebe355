"""The queue's policy: priority, fair share, backfill, limits and reasons (pure)."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuwarden.planning import scheduling as s

GiB = 2**30
DAY = 86400.0


def gpus(n: int, memory: int = 80 * GiB) -> list[s.QueueGpu]:
    return [s.QueueGpu(f"GPU-{i}", memory) for i in range(n)]


def by_id(decisions: list[s.Decision]) -> dict[str, s.Decision]:
    return {d.id: d for d in decisions}


# --- worked examples (docs/service.md uses the same numbers) -------------------


def test_fair_share_worked_example() -> None:
    # Equal shares; alice used 10x bob's GPU-hours. U/S: alice (10/11)/(1/2), bob (1/11)/(1/2).
    usage = {"alice": 100 * 3600.0, "bob": 10 * 3600.0}
    policy = s.Policy()
    assert s.fairshare_factor("alice", usage, policy) == pytest.approx(2 ** (-20 / 11))
    assert s.fairshare_factor("bob", usage, policy) == pytest.approx(2 ** (-2 / 11))
    assert s.fairshare_factor("carol", usage, policy) == 1.0  # used nothing


def test_the_lighter_user_starts_first_even_when_submitting_later() -> None:
    usage = {"alice": 100 * 3600.0, "bob": 10 * 3600.0}
    waiting = [
        s.Waiting("a1", "alice", 1, submitted=0.0),
        s.Waiting("b1", "bob", 1, submitted=10.0),
    ]
    decisions = s.plan(gpus(1), [], waiting, usage, now=20.0)
    assert [d.id for d in decisions] == ["b1", "a1"]
    assert decisions[0].starts and decisions[0].gpus == ("GPU-0",)
    assert decisions[1].reason == s.RESOURCES


def test_backfill_starts_a_short_job_that_cannot_delay_the_big_one() -> None:
    running = [s.Running("r", "carol", ("GPU-0", "GPU-1"), started=0.0, time_limit=100.0)]
    waiting = [
        s.Waiting("big", "alice", 4, submitted=0.0, qos=1.0),  # highest priority
        s.Waiting("short", "bob", 1, submitted=1.0, time_limit=50.0),
        s.Waiting("long", "bob", 1, submitted=2.0, time_limit=500.0),
        s.Waiting("nolimit", "bob", 1, submitted=3.0),
    ]
    d = by_id(s.plan(gpus(4), running, waiting, {}, now=10.0))
    assert d["big"].reason == s.RESOURCES and d["big"].estimated_start == 100.0
    assert d["short"].starts
    assert d["long"].reason == s.PRIORITY  # would still hold a GPU at t=100
    assert d["nolimit"].reason == s.PRIORITY


def test_a_job_may_outlive_the_reservation_on_gpus_it_leaves_free() -> None:
    # 4 GPUs, 1 running until t=100; the big job needs 3: one GPU is spare even then.
    running = [s.Running("r", "carol", ("GPU-0",), started=0.0, time_limit=100.0)]
    waiting = [
        s.Waiting(
            "big",
            "alice",
            3,
            submitted=0.0,
            qos=1.0,
            eligible=frozenset({"GPU-0", "GPU-1", "GPU-2"}),
        ),
        s.Waiting("other", "bob", 1, submitted=1.0),
    ]
    # `big` fits now? GPU-0 is taken, so only GPU-1 and GPU-2 of its three: it waits.
    d = by_id(s.plan(gpus(4), running, waiting, {}, now=10.0))
    assert d["big"].reason == s.RESOURCES
    assert d["other"].starts and d["other"].gpus == ("GPU-3",)


def test_without_time_limits_small_jobs_start_until_the_big_one_is_old() -> None:
    running = [s.Running("r", "carol", ("GPU-0", "GPU-1"), started=0.0)]
    waiting = [
        s.Waiting("big", "alice", 3, submitted=0.0, qos=1.0),
        s.Waiting("small", "bob", 1, submitted=1.0),
    ]
    policy = s.Policy(starve_after=3600.0)
    young = by_id(s.plan(gpus(4), running, waiting, {}, now=60.0, policy=policy))
    assert young["big"].reason == s.RESOURCES and young["big"].estimated_start is None
    assert young["small"].starts  # GPUs are not kept idle for an unbounded wait
    old = by_id(s.plan(gpus(4), running, waiting, {}, now=7200.0, policy=policy))
    assert old["small"].reason == s.PRIORITY  # now the big job's GPUs are kept for it


def test_reasons_held_dependency_limit_drained() -> None:
    running = [s.Running("r", "alice", ("GPU-0",), started=0.0)]
    waiting = [
        s.Waiting("held", "bob", 1, submitted=0.0, held=True),
        s.Waiting("dep", "bob", 1, submitted=0.0, after=("r",)),
        s.Waiting("depfail", "bob", 1, submitted=0.0, after=("gone",)),
        s.Waiting("depdone", "bob", 1, submitted=0.0, after=("ok",)),
        s.Waiting("limit", "alice", 2, submitted=0.0),
        s.Waiting("exempt", "root", 2, submitted=0.0),
        s.Waiting("drained", "bob", 1, submitted=0.0, eligible=frozenset({"GPU-7"})),
        s.Waiting("toobig", "bob", 1, submitted=0.0, mem=100 * GiB),
    ]
    policy = s.Policy(max_gpus_per_user=2, exempt=frozenset({"root"}))
    usable = [*gpus(7), s.QueueGpu("GPU-7", 80 * GiB, usable=False)]
    d = by_id(
        s.plan(
            usable,
            running,
            waiting,
            {},
            now=1.0,
            policy=policy,
            finished={"gone": False, "ok": True},
        )
    )
    assert d["held"].reason == s.HELD
    assert d["dep"].reason == s.DEPENDENCY
    assert d["depfail"].reason == s.DEPENDENCY_FAILED
    assert d["depdone"].starts
    assert d["limit"].reason == s.USER_GPU_LIMIT
    assert d["exempt"].starts
    assert d["drained"].reason == s.DRAINED
    assert d["toobig"].reason == s.DRAINED  # no GPU is big enough: it could wait forever


def test_shared_jobs_pack_by_declared_memory() -> None:
    waiting = [s.Waiting(f"m{i}", "alice", 1, submitted=float(i), mem=30 * GiB) for i in range(5)]
    d = s.plan(gpus(2), [], waiting, {}, now=10.0)
    placed = [x.gpus[0] for x in d if x.starts]
    assert placed.count("GPU-0") == 2 and placed.count("GPU-1") == 2  # 2x30 fit in 80, 3x30 do not
    assert [x.reason for x in d if not x.starts] == [s.RESOURCES]


def test_shared_jobs_fill_a_started_card_before_a_free_one() -> None:
    running = [s.Running("r", "bob", ("GPU-1",), started=0.0, mem=20 * GiB)]
    d = s.plan(gpus(2), running, [s.Waiting("m", "alice", 1, 0.0, mem=20 * GiB)], {}, now=1.0)
    assert d[0].gpus == ("GPU-1",)  # GPU-0 stays whole for a whole-GPU job


def test_overdue_terms_then_kills() -> None:
    jobs = [
        s.Running("ok", "a", ("GPU-0",), started=0.0, time_limit=100.0),
        s.Running("term", "a", ("GPU-1",), started=0.0, time_limit=50.0),
        s.Running("kill", "a", ("GPU-2",), started=0.0, time_limit=10.0),
        s.Running("free", "a", ("GPU-3",), started=0.0),
    ]
    assert s.overdue(jobs, now=60.0, grace=30.0) == [("term", s.TERM), ("kill", s.KILL)]


def test_usage_decays_with_the_half_life() -> None:
    assert s.decayed(100.0, 7 * DAY, 7 * DAY) == pytest.approx(50.0)
    assert s.decayed(100.0, 14 * DAY, 7 * DAY) == pytest.approx(25.0)
    assert s.decayed(100.0, -5.0, 7 * DAY) == 100.0
    assert s.job_usage(2, 3600.0) == 7200.0
    assert s.job_usage(1, 3600.0, mem=20 * GiB, memory=80 * GiB) == 900.0


# --- properties ----------------------------------------------------------------

users = st.sampled_from(["alice", "bob", "carol", "dave"])


@st.composite
def queues(
    draw: st.DrawFn,
) -> tuple[list[s.QueueGpu], list[s.Running], list[s.Waiting], dict, float]:
    n = draw(st.integers(1, 8))
    machine = gpus(n)
    uuids = [g.uuid for g in machine]
    running: list[s.Running] = []
    taken: set[str] = set()
    for i in range(draw(st.integers(0, n))):
        free = [u for u in uuids if u not in taken]
        if not free:
            break
        k = draw(st.integers(1, len(free)))
        chosen = tuple(free[:k])
        taken.update(chosen)
        limit = draw(st.one_of(st.none(), st.floats(1, 1000)))
        running.append(s.Running(f"r{i}", draw(users), chosen, started=0.0, time_limit=limit))
    waiting = []
    for i in range(draw(st.integers(0, 12))):
        mem = draw(st.one_of(st.none(), st.sampled_from([10 * GiB, 30 * GiB, 50 * GiB])))
        waiting.append(
            s.Waiting(
                f"w{i}",
                draw(users),
                draw(st.integers(1, n)),
                submitted=draw(st.floats(0, 100)),
                mem=mem,
                time_limit=draw(st.one_of(st.none(), st.floats(1, 1000))),
                nice=draw(st.integers(-20, 19)),
                held=draw(st.booleans()) and draw(st.booleans()),
                after=tuple(draw(st.lists(st.sampled_from(["r0", "w0", "x"]), max_size=1))),
            )
        )
    usage = draw(st.dictionaries(users, st.floats(0, 1e6)))
    return machine, running, waiting, usage, 200.0


@settings(max_examples=150, deadline=None)
@given(queues(), st.one_of(st.none(), st.integers(1, 4)))
def test_plan_never_overcommits_and_respects_every_rule(q, limit) -> None:  # type: ignore[no-untyped-def]
    machine, running, waiting, usage, now = q
    policy = s.Policy(max_gpus_per_user=limit)
    decisions = s.plan(machine, running, waiting, usage, now, policy=policy)
    assert sorted(d.id for d in decisions) == sorted(w.id for w in waiting)
    jobs = {w.id: w for w in waiting}
    whole: dict[str, int] = {}
    declared: dict[str, int] = {}
    per_user: dict[str, int] = {}
    for r in running:
        per_user[r.user] = per_user.get(r.user, 0) + len(r.gpus)
        for u in r.gpus:
            whole[u] = whole.get(u, 0) + 1
    for d in decisions:
        if not d.starts:
            continue
        job = jobs[d.id]
        assert not job.held
        assert not set(job.after) & ({w.id for w in waiting} | {r.id for r in running})
        assert len(d.gpus) == job.count == len(set(d.gpus))
        per_user[job.user] = per_user.get(job.user, 0) + job.count
        for u in d.gpus:
            if job.mem is None:
                whole[u] = whole.get(u, 0) + 1
            else:
                declared[u] = declared.get(u, 0) + job.mem
    for u in whole:
        assert whole[u] <= 1 and (whole[u] == 0 or declared.get(u, 0) == 0)
    for u in declared:
        assert declared[u] <= 80 * GiB
    if limit is not None:
        started_users = {jobs[d.id].user for d in decisions if d.starts}
        for user in started_users:
            assert per_user[user] <= limit


@settings(max_examples=150, deadline=None)
@given(queues())
def test_backfill_never_delays_the_reserved_job(q) -> None:  # type: ignore[no-untyped-def]
    machine, running, waiting, usage, now = q
    decisions = s.plan(machine, running, waiting, usage, now)
    reserved = next((d for d in decisions if d.estimated_start is not None), None)
    if reserved is None:
        return
    jobs = {w.id: w for w in waiting}
    after = list(running) + [
        s.Running(d.id, jobs[d.id].user, d.gpus, now, jobs[d.id].mem, jobs[d.id].time_limit)
        for d in decisions
        if d.starts
    ]
    later = s.plan(machine, after, [jobs[reserved.id]], {}, now)
    assert later[0].estimated_start is not None
    assert later[0].estimated_start <= reserved.estimated_start


@given(
    st.floats(0, 1e7),
    st.floats(0, 1e7),
    st.floats(0, 1e7),
    st.floats(0, 30 * DAY),
    st.floats(0, 30 * DAY),
)
def test_priority_is_monotone_in_usage_and_age(u1, u2, other, age1, age2) -> None:  # type: ignore[no-untyped-def]
    policy = s.Policy()
    lo, hi = sorted((u1, u2))
    young, old = sorted((age1, age2))
    job = s.Waiting("j", "alice", 1, submitted=0.0)

    def p(usage: float, age: float) -> float:
        factor = s.fairshare_factor("alice", {"alice": usage, "bob": other}, policy)
        return s.priority(job, age, factor, policy)

    assert p(hi, young) <= p(lo, young) + 1e-9
    assert p(lo, young) <= p(lo, old) + 1e-9
    assert 0.0 <= s.fairshare_factor("alice", {"alice": hi, "bob": other}, policy) <= 1.0


@given(st.floats(0, 1e9), st.floats(1, 1e8))
def test_usage_halves_every_half_life(usage, half_life) -> None:  # type: ignore[no-untyped-def]
    assert s.decayed(usage, half_life, half_life) == pytest.approx(usage / 2)
    assert s.decayed(s.decayed(usage, 3.0, half_life), 4.0, half_life) == pytest.approx(
        s.decayed(usage, 7.0, half_life)
    )
    assert not math.isnan(s.decayed(usage, 1e12, half_life))


def test_a_job_before_its_begin_time_says_so_before_any_limit() -> None:
    """A `--begin` job of a user at their GPU limit waits for its time first: its reason
    is BeginTime, not UserGpuLimit (as squeue says it)."""
    running = [s.Running("r", "alice", ("GPU-0",), started=0.0)]
    later = s.Waiting("later", "alice", 1, submitted=1.0, begin=500.0)
    policy = s.Policy(max_gpus_per_user=1)
    (decision,) = s.plan(gpus(4), running, [later], {}, now=10.0, policy=policy)
    assert decision.reason == s.BEGIN_TIME
    (after,) = s.plan(gpus(4), running, [later], {}, now=600.0, policy=policy)
    assert after.reason == s.USER_GPU_LIMIT
