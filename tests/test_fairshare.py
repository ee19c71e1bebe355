"""Fair share with accounts (pure): the account level of the factor and an account's GPU
cap, on hand-built queues; tests/test_service_usage.py has them through the service."""

from __future__ import annotations

import dataclasses

import pytest

from gpuwarden.planning import fairshare
from gpuwarden.planning import scheduling as s

HOUR = 3600.0


def gpus(n: int) -> list[s.QueueGpu]:
    return [s.QueueGpu(f"GPU-{i}", 80 << 30) for i in range(n)]


def test_without_account_shares_the_factor_is_the_users_alone() -> None:
    usage = {"alice": 100 * HOUR, "bob": 10 * HOUR}
    got = fairshare.job_factors({("alice", "vision"), ("bob", None)}, usage, s.Policy())
    assert got[("alice", "vision")] == pytest.approx(2 ** (-20 / 11))
    assert got[("bob", None)] == pytest.approx(2 ** (-2 / 11))


def test_the_account_factor_weighs_the_usage_charged_to_each_account_by_its_share() -> None:
    # vision has share 3, nlp 1; each used half of all: U/S is 0.5/0.75 and 0.5/0.25.
    policy = s.Policy(
        account_shares={"vision": 3.0, "nlp": 1.0},
        account_usage={("vision", "alice"): 10 * HOUR, ("nlp", "bob"): 10 * HOUR},
    )
    assert fairshare.account_factors(policy) == {
        "vision": pytest.approx(2 ** (-0.5 / 0.75)),
        "nlp": pytest.approx(2 ** (-0.5 / 0.25)),
    }
    # Within its account: bob used all of nlp's with all its shares (2^-1); alice all
    # of vision's with half its users' shares, carol being there too (2^-2); carol,
    # who used none of it, 1.
    got = fairshare.job_factors(
        {("alice", "vision"), ("bob", "nlp"), ("carol", "vision")}, {}, policy
    )
    assert got[("alice", "vision")] == pytest.approx(2 ** (-0.5 / 0.75) * 0.25)
    assert got[("carol", "vision")] == pytest.approx(2 ** (-0.5 / 0.75))
    assert got[("bob", "nlp")] == pytest.approx(2 ** (-0.5 / 0.25) * 0.5)
    # So although bob submitted first and used as much, alice's job starts first.
    waiting = [
        s.Waiting("b1", "bob", 1, submitted=0.0, account="nlp"),
        s.Waiting("a1", "alice", 1, submitted=10.0, account="vision"),
    ]
    decisions = s.plan(gpus(1), [], waiting, {}, now=20.0, policy=policy)
    assert [(d.id, d.starts) for d in decisions] == [("a1", True), ("b1", False)]


def test_jobs_of_no_account_form_one_account_of_the_default_share() -> None:
    policy = s.Policy(
        account_shares={"vision": 2.0},
        account_usage={("vision", "alice"): 2 * HOUR, ("", "dave"): 2 * HOUR},
    )
    factors = fairshare.account_factors(policy)
    assert factors[fairshare.NO_ACCOUNT] == pytest.approx(2 ** (-0.5 / (1 / 3)))
    assert factors["vision"] == pytest.approx(2 ** (-0.5 / (2 / 3)))


def run_queue(policy: s.Policy, members: dict[str, list[str]], rounds: int) -> dict[str, float]:
    """A machine of 4 GPUs kept full by every user of every account (each always has a
    1-GPU, 1-hour job waiting), for `rounds` hours: the GPU-hours each user got, charged
    back to fair share after every hour as the service does at each job's end."""
    used: dict[tuple[str, str], float] = {}
    got: dict[str, float] = {}
    for hour in range(rounds):
        now = hour * HOUR
        waiting = [
            s.Waiting(f"{user}{hour}.{i}", user, 1, submitted=now, account=account)
            for account, users in members.items()
            for user in users
            for i in range(4)
        ]
        ask = dataclasses.replace(policy, account_usage=dict(used))
        for d in s.plan(gpus(4), [], waiting, {}, now, ask):
            if d.starts:
                job = next(w for w in waiting if w.id == d.id)
                key = (job.account or "", job.user)
                used[key] = used.get(key, 0.0) + HOUR
                got[job.user] = got.get(job.user, 0.0) + 1.0
    return got


def test_two_accounts_of_shares_3_and_1_get_the_gpus_3_to_1_whatever_their_sizes() -> None:
    # vision has three users, nlp one: per user fair share would give nlp a quarter;
    # the account shares give vision 3/4 and nlp 1/4 however many users each has, and
    # vision's users split theirs evenly.
    policy = s.Policy(account_shares={"vision": 3.0, "nlp": 1.0}, half_life=1e9)
    members = {"vision": ["alice", "carol", "erin"], "nlp": ["bob"]}
    got = run_queue(policy, members, 200)
    vision = got["alice"] + got["carol"] + got["erin"]
    assert vision + got["bob"] == 800
    assert vision / got["bob"] == pytest.approx(3.0, rel=0.05), got
    for user in ("alice", "carol", "erin"):
        assert got[user] == pytest.approx(vision / 3, rel=0.05), got
    # Equal shares: an even split between the accounts (not 3:1 by head count).
    even = run_queue(dataclasses.replace(policy, account_shares={"vision": 1.0}), members, 200)
    assert (even["alice"] + even["carol"] + even["erin"]) / even["bob"] == pytest.approx(
        1.0, rel=0.05
    )


def test_an_accounts_max_gpus_caps_its_jobs_together_but_not_others() -> None:
    policy = s.Policy(account_caps={"vision": 2}, exempt=frozenset({"root"}))
    running = [s.Running("r", "alice", ("GPU-0",), 0.0, account="vision")]
    waiting = [
        s.Waiting("a1", "carol", 1, submitted=1.0, account="vision"),
        s.Waiting("a2", "alice", 1, submitted=2.0, account="vision"),
        s.Waiting("b1", "bob", 1, submitted=3.0, account="nlp"),
        s.Waiting("r1", "root", 1, submitted=4.0, account="vision"),
    ]
    d = {x.id: x for x in s.plan(gpus(5), running, waiting, {}, 10.0, policy)}
    assert d["a1"].starts  # one running + this one: the 2 allowed
    assert d["a2"].reason == s.ACCOUNT_GPU_LIMIT
    assert d["b1"].starts
    assert d["r1"].starts  # an admin's job is not held back (it counts, though)
    # Preemptible jobs are beyond every cap: they yield their GPUs when needed.
    spare = s.Waiting("p1", "alice", 1, submitted=5.0, account="vision", preemptible=True)
    from gpuwarden.planning import preemption

    decisions, _ = preemption.plan(gpus(5), running, [*waiting, spare], {}, 10.0, policy)
    assert {x.id: x for x in decisions}["p1"].starts
