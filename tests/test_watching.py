"""The service watcher's pure parts: what unreserved use costs, and how `queue` says it."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from gpuwarden.cli.jobtables import unleased_lines
from gpuwarden.service.watching import charges
from gpuwarden.usage.enforcement import Unleased

finds = st.lists(
    st.builds(
        Unleased,
        pid=st.integers(1, 50),
        gpu=st.sampled_from(["GPU-a", "GPU-b", "GPU-c"]),
        user=st.sampled_from(["alice", "bob", None]),
        leased_to=st.none(),
    ),
    max_size=20,
)


@given(found=finds, seconds=st.floats(0, 1e4))
def test_one_gpu_per_gpu_used_whatever_the_processes(found, seconds) -> None:
    got = charges(found, seconds)
    for user in ("alice", "bob"):
        used = {f.gpu for f in found if f.user == user}
        assert got.get(user, 0.0) == len(used) * seconds
    assert set(got) <= {"alice", "bob"}  # a process of no known user is charged to nobody


def test_negative_time_charges_nothing() -> None:
    assert charges([Unleased(1, "GPU-a", "bob", None)], -5.0) == {"bob": 0.0}


def test_queue_header_lines() -> None:
    rows = [
        {"gpu": "GPU-b", "index": 1, "pid": 42, "user": "bob", "leased_to": "alice", "since": 0.0},
        {"gpu": "GPU-b", "index": 1, "pid": 43, "user": "bob", "leased_to": None, "since": 30.0},
        {"gpu": "GPU-c", "index": None, "pid": 7, "user": "ev\x1bil", "since": None},
    ]
    lines = unleased_lines(rows, now=190.0)
    assert (
        lines[0] == "unreserved: GPU 1 used by bob (pid 42,43) for 3m10s, on a GPU leased to alice"
    )
    assert lines[1].startswith("unreserved: GPU ? used by ev\\x1bil (pid 7) for 0s")
    assert unleased_lines([]) == []


def test_a_process_on_a_mig_slice_is_shown_on_its_gpu(monkeypatch) -> None:
    from gpuwarden.machine import inventory
    from gpuwarden.service.watching import gpu_indices

    monkeypatch.setenv("GPUWARDEN_SIM", "mixed")
    gpus = inventory.read_snapshot().gpus
    [parent] = [g for g in gpus if g.mig_instances]
    indices = gpu_indices(gpus)
    assert {indices[m.uuid] for m in parent.mig_instances} == {parent.index}
    assert all(indices[g.uuid] == g.index for g in gpus)
