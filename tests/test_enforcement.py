"""The enforcement policies: pure functions, property-tested."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpuwarden import config
from gpuwarden.base.errors import UserError
from gpuwarden.usage.enforcement import (
    EnforceSettings,
    Idle,
    Lease,
    Since,
    Unleased,
    Use,
    idle_action,
    memory_action,
    over_memory,
    track,
    unleased,
    unleased_action,
)

GiB = 2**30
sizes = st.integers(0, 200 * GiB)
times = st.floats(0, 1e6, allow_nan=False)
policies = st.builds(
    EnforceSettings,
    memory_tolerance=st.floats(0, 100),
    memory_grace=st.floats(0, 3600),
    memory_action=st.sampled_from(["notify", "kill"]),
    unleased_grace=st.floats(0, 3600),
    unleased_action=st.sampled_from(["notify", "kill"]),
    idle_after=st.floats(0.001, 1e5),
    idle_action=st.sampled_from(["report", "release"]),
)


@given(declared=sizes, data=st.data(), policy=policies, steps=st.lists(times, max_size=20))
def test_a_job_within_its_declaration_is_never_touched(declared, data, policy, steps) -> None:
    state = None
    for now in sorted(steps):
        used = data.draw(st.integers(0, declared))
        state, action = memory_action(declared, used, state, now, policy)
        assert action is None and state is None


@given(used=st.one_of(st.none(), sizes), policy=policies, now=times)
def test_an_exclusive_job_or_an_unknown_reading_is_never_over(used, policy, now) -> None:
    assert memory_action(None, used, None, now, policy) == (None, None)
    assert memory_action(10 * GiB, None, None, now, policy) == (None, None)


@given(
    declared=st.integers(1, 100 * GiB),
    tolerance=st.floats(0, 100),
    grace=st.floats(0.5, 600),
    kill=st.booleans(),
)
def test_over_is_warned_then_acted_on_once_after_the_grace(declared, tolerance, grace, kill):
    policy = EnforceSettings(
        memory_tolerance=tolerance, memory_grace=grace, memory_action="kill" if kill else "notify"
    )
    used = declared * 3
    assert over_memory(declared, used, tolerance)
    state, action = memory_action(declared, used, None, 0.0, policy)
    assert action == "warn"
    state, action = memory_action(declared, used, state, grace / 2, policy)
    assert action is None
    state, action = memory_action(declared, used, state, grace, policy)
    assert action == ("kill" if kill else "notify")
    assert memory_action(declared, used, state, 100.0 + 2 * grace, policy)[1] is None
    # Back under: forgotten; over again: a fresh warning and a fresh grace.
    state, action = memory_action(declared, declared, state, 200.0 + 2 * grace, policy)
    assert (state, action) == (None, None)
    assert memory_action(declared, used, state, 300.0 + 2 * grace, policy)[1] == "warn"


def test_tolerance_is_a_percentage_of_the_declaration() -> None:
    assert not over_memory(10 * GiB, 11 * GiB, 10.0)
    assert over_memory(10 * GiB, 11 * GiB + 1, 10.0)
    assert over_memory(10 * GiB, 10 * GiB + 1, 0.0)


@given(bad=st.lists(st.booleans(), max_size=30), grace=st.floats(0, 10))
def test_track_expires_at_most_once_per_episode(bad, grace) -> None:
    state: Since | None = None
    expired_in_episode = 0
    for step, b in enumerate(bad):
        state, event = track(b, state, float(step), grace)
        if not b:
            assert state is None and event is None
            expired_in_episode = 0
            continue
        expired_in_episode += event == "expired"
        assert expired_in_episode <= 1


# --- unleased use ---------------------------------------------------------------------------------

LEASES = [Lease("GPU-2", pid=100, owner="alice"), Lease("GPU-3", pid=200, owner="bob")]


def test_a_process_of_a_lease_or_its_children_is_leased() -> None:
    uses = [
        Use(100, "GPU-2", "alice", lineage=(100, 50, 1)),  # the job itself
        Use(101, "GPU-2", "alice", lineage=(101, 100, 50, 1)),  # its DataLoader worker
        Use(102, "GPU-3", "alice", lineage=(102, 100, 50, 1)),  # alice's job on bob's GPU
        Use(300, "GPU-2", "carol", lineage=(300, 1)),  # plain python on alice's GPU
        Use(301, "GPU-5", "carol", lineage=(301, 1)),  # plain python on a free GPU
    ]
    assert unleased(uses, LEASES) == [
        Unleased(102, "GPU-3", "alice", "bob"),
        Unleased(300, "GPU-2", "carol", "alice"),
        Unleased(301, "GPU-5", "carol", None),
    ]


@given(policy=policies, later=st.floats(0, 1e5), on_someone_elses=st.booleans())
def test_unleased_use_is_notified_and_killed_only_on_anothers_gpu(policy, later, on_someone_elses):
    finding = Unleased(300, "GPU-2", "carol", "alice" if on_someone_elses else None)
    state, first = unleased_action(finding, None, 0.0, policy)
    state, second = unleased_action(finding, state, later, policy)
    actions = [first, second]
    may_kill = policy.unleased_action == "kill" and on_someone_elses
    if not may_kill:
        assert "kill" not in actions
        assert first == "notify"
    elif policy.unleased_grace <= 0:
        assert first == "kill"
    else:
        assert first == "notify"
        assert second == ("kill" if later >= policy.unleased_grace else None)


def test_by_default_unleased_use_is_never_killed() -> None:
    policy = EnforceSettings.from_config(config.load(environ={}))
    finding = Unleased(300, "GPU-2", "carol", "alice")
    state, action = unleased_action(finding, None, 0.0, policy)
    assert action == "notify"
    assert unleased_action(finding, state, 1e9, policy)[1] is None


# --- idle leases ----------------------------------------------------------------------------------


@given(
    readings=st.lists(
        st.tuples(st.integers(0, 100), st.one_of(st.none(), st.integers(0, 10))), max_size=30
    ),
    policy=policies,
)
def test_an_active_lease_is_never_released(readings, policy) -> None:
    """A lease busy at every reading, or whose memory changes at every reading, never
    gets an action."""
    last: Idle | None = None
    for step, (util, _) in enumerate(readings):
        memory = step + 1  # memory moves every time
        last, action = idle_action(util, memory, last, step * 1e5, policy)
        assert action is None
    last = None
    for step, (util, mem) in enumerate(readings):
        last, action = idle_action(util + 1, mem, last, step * 1e5, policy)
        assert action is None


@pytest.mark.parametrize("action", ["report", "release"])
def test_an_idle_lease_is_acted_on_once_after_idle_after(action) -> None:
    policy = EnforceSettings(idle_after=60.0, idle_action=action)
    last, got = idle_action(0, 5 * GiB, None, 0.0, policy)  # first reading: nothing to compare
    assert got is None
    last, got = idle_action(0, 5 * GiB, last, 10.0, policy)
    assert got is None
    last, got = idle_action(0, 5 * GiB, last, 70.0, policy)
    assert got == action
    last, got = idle_action(0, 5 * GiB, last, 700.0, policy)
    assert got is None
    last, got = idle_action(3, 5 * GiB, last, 701.0, policy)  # it woke up: the count restarts
    assert last.since is None and got is None


# --- config --------------------------------------------------------------------------------------


def test_defaults_are_safe() -> None:
    policy = EnforceSettings.from_config(config.load(environ={}))
    assert (policy.memory_action, policy.unleased_action, policy.idle_action) == (
        "notify",
        "notify",
        "report",
    )


@pytest.mark.parametrize(
    "key, value",
    [
        ("enforce.devices", "maybe"),
        ("enforce.memory_tolerance", "150"),
        ("enforce.memory_tolerance", "-1"),
        ("enforce.memory_grace", "soon"),
        ("enforce.memory_action", "shoot"),
        ("enforce.unleased_grace", "-5"),
        ("enforce.unleased_action", "terminate"),
        ("enforce.idle_after", "0"),
        ("enforce.idle_action", "kill"),
        ("enforce.poll_seconds", "0s"),
    ],
)
def test_every_bad_policy_value_is_one_line_naming_the_key(tmp_path, key, value) -> None:
    section, name = key.split(".")
    path = tmp_path / "config.toml"
    path.write_text(f'[{section}]\n{name} = "{value}"\n')
    with pytest.raises(UserError) as err:
        config.load(environ={"GPUWARDEN_SYSTEM_CONFIG": str(path)})
    assert key in str(err.value) and "\n" not in str(err.value)
    variable = "GPUWARDEN_" + key.upper().replace(".", "_")
    with pytest.raises(UserError) as err:
        config.load(environ={variable: value})
    assert key in str(err.value) and "\n" not in str(err.value)
