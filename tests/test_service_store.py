"""The service's journal: what is committed survives, and reads back as it was written."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuwarden.service import store as s

DAY = 86400.0


def job(**kw: object) -> s.Job:
    fields = {
        "uid": 1000,
        "gid": 1000,
        "user": "alice",
        "argv": ("python", "train.py"),
        "cwd": "/home/alice",
        "env": {"PATH": "/usr/bin"},
        "umask": 0o022,
        "request": {"count": 2},
    }
    fields.update(kw)
    return s.new_job(**fields)


def test_jobs_round_trip(tmp_path: Path) -> None:
    store = s.Store(str(tmp_path / "db" / "state.db"))
    a = store.add(job(after=(7,), time_limit=60.0))
    b = store.add(job(user="bob", uid=1001, held=True))
    assert (a.id, b.id) == (1, 2)
    got = store.get(a.id)
    assert got is not None and got.argv == ("python", "train.py") and got.after == (7,)
    assert got.env == {"PATH": "/usr/bin"} and got.count == 2 and got.state == s.PENDING
    store.update(a.id, state=s.RUNNING, gpus=("GPU-1", "GPU-2"), pid=123, started=5.0)
    assert store.get(a.id).gpus == ("GPU-1", "GPU-2")  # type: ignore[union-attr]
    assert [j.id for j in store.jobs([s.RUNNING])] == [a.id]
    assert store.count_active(1001) == 1
    store.update(a.id, state=s.COMPLETED, exit_code=0)
    store.update(b.id, state=s.CANCELLED)
    assert [j.id for j in store.jobs(s.ENDED)] == [b.id, a.id]  # history: newest first
    with pytest.raises(ValueError):
        store.update(a.id, nonsense=1)
    assert oct(os.stat(tmp_path / "db" / "state.db").st_mode & 0o777) == "0o600"


def test_a_committed_change_survives_a_kill(tmp_path: Path) -> None:
    """The writer is killed with SIGKILL right after `update` returns: a new reader sees it."""
    path = tmp_path / "state.db"
    code = (
        "import os, signal\n"
        "from gpuwarden.service import store as s\n"
        f"st = s.Store({str(path)!r})\n"
        "j = st.add(s.new_job(uid=1, gid=1, user='a', argv=('x',), cwd='/', env={}, umask=18,"
        " request={}))\n"
        "st.update(j.id, state=s.STARTING)\n"
        "os.kill(os.getpid(), signal.SIGKILL)\n"
    )
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).parent.parent / "src"))
    run = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert run.returncode == -9, run.stderr
    assert s.Store(str(path)).get(1).state == s.STARTING  # type: ignore[union-attr]


def test_usage_is_charged_and_decays(tmp_path: Path) -> None:
    store = s.Store(str(tmp_path / "u.db"))
    store.charge("alice", 7200.0, now=0.0, half_life=7 * DAY)
    store.charge("alice", 800.0, now=7 * DAY, half_life=7 * DAY)
    assert store.usage(7 * DAY, 7 * DAY)["alice"] == pytest.approx(4400.0)
    assert store.usage(14 * DAY, 7 * DAY)["alice"] == pytest.approx(2200.0)


STATES = (*s.ACTIVE, *s.ENDED)
steps = st.lists(
    st.one_of(
        st.tuples(st.just("add"), st.sampled_from(STATES), st.booleans()),
        st.tuples(st.just("update"), st.integers(1, 8), st.sampled_from(STATES)),
        st.tuples(st.just("update-rolled-back"), st.integers(1, 8), st.sampled_from(STATES)),
    ),
    max_size=25,
)


@settings(max_examples=60)
@given(steps)
def test_the_active_jobs_kept_in_memory_are_what_the_journal_holds(
    tmp_path_factory: pytest.TempPathFactory, script: list[tuple[object, ...]]
) -> None:
    path = str(tmp_path_factory.mktemp("db") / "state.db")
    store = s.Store(path)
    store.jobs()  # the in-memory copy is made first, then kept up to date
    for op, a, b in script:
        if op == "add":
            store.add(job(state=a, held=b, after=[1, 2]))
        elif op == "update":
            store.update(int(a), state=b, gpus=["GPU-1"], held=1)  # type: ignore[call-overload]
        else:
            with pytest.raises(RuntimeError), store.transaction():
                store.update(int(a), state=b, reason="never")  # type: ignore[call-overload]
                raise RuntimeError("rolled back")
    fresh = s.Store(path)  # reads every row from disk
    for states in (s.ACTIVE, (s.PENDING,), (s.STARTING, s.RUNNING)):
        assert store.jobs(states) == fresh.jobs(states)
    for job_id in range(1, 9):
        assert store.get(job_id) == fresh.get(job_id)
    store.close()
    fresh.close()


def test_states_of_named_jobs_however_old(tmp_path: Path) -> None:
    store = s.Store(str(tmp_path / "state.db"))
    ids = [store.add(job(state=s.COMPLETED)).id for _ in range(1200)]
    store.update(ids[0], state=s.FAILED)
    assert store.states([ids[0], ids[-1], 99999]) == {ids[0]: s.FAILED, ids[-1]: s.COMPLETED}
    assert len(store.states(ids)) == 1200  # more ids than SQLite takes in one statement
