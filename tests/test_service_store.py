"""The service's journal: what is committed survives, and reads back as it was written."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

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
