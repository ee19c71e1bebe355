"""The service's journal: what is committed survives, and reads back as it was written."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuwarden.service import store as s
from gpuwarden.service.states import TRANSITIONS, IllegalMove

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
    store.update(a.id, state=s.STARTING, gpus=("GPU-1", "GPU-2"), started=5.0)
    store.update(a.id, state=s.RUNNING, pid=123)
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


def _fsyncs(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The files `os.fsync` or `os.fdatasync` is called on, by name, from now on."""
    synced: list[str] = []
    for name in ("fsync", "fdatasync"):  # the log's data, as SQLite syncs it, or all
        real = getattr(os, name)

        def recording(fd: int, real: Any = real) -> None:
            synced.append(os.readlink(f"/proc/self/fd/{fd}"))
            real(fd)

        monkeypatch.setattr(os, name, recording)
    return synced


def test_a_deferred_commit_is_synced_once_and_only_when_needed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A `durable=False` commit leaves the journal unsynced until `sync` (one fsync of
    the write-ahead log) or a durable commit (which syncs the log with it)."""
    store = s.Store(str(tmp_path / "state.db"))
    a = store.add(job(state=s.RUNNING))
    assert not store.unsynced
    synced = _fsyncs(monkeypatch)
    store.sync()
    assert synced == []  # nothing deferred: no fsync
    store.update(a.id, durable=False, state=s.COMPLETED)
    assert store.unsynced
    store.sync()
    assert synced == [str(tmp_path / "state.db-wal")] and not store.unsynced
    store.update(a.id, durable=False, reason="x")
    store.update(a.id, error="y")  # a durable commit carries the deferred one
    store.sync()
    assert len(synced) == 1 and not store.unsynced
    with pytest.raises(RuntimeError), store.transaction(durable=False):
        store.update(a.id, reason="z")
        raise RuntimeError  # rolled back: nothing to sync
    assert not store.unsynced
    store.update(a.id, durable=False, reason="w")
    store.close()  # closing syncs what is deferred
    assert len(synced) == 2
    assert s.Store(str(tmp_path / "state.db")).get(a.id).reason == "w"  # type: ignore[union-attr]


def test_the_log_is_opened_once_for_its_syncs_and_again_once_removed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each `sync` opened the write-ahead log again (an open and a close a start): it
    is kept open now, and opened again only when the file it names was removed (its
    link count 0), never synced in place of the log there now."""
    store = s.Store(str(tmp_path / "state.db"))
    a = store.add(job(state=s.RUNNING))
    wal = str(tmp_path / "state.db-wal")
    opened: list[str] = []
    real = os.open
    monkeypatch.setattr(os, "open", lambda p, *a, **k: opened.append(str(p)) or real(p, *a, **k))
    synced = _fsyncs(monkeypatch)
    for n in range(5):
        store.update(a.id, durable=False, reason=str(n))
        store.sync()
    assert opened.count(wal) == 1 and synced == [wal] * 5
    kept = os.fstat(store._wal).st_ino
    os.unlink(wal)  # as a last connection's close removes it; another log in its place
    with open(wal, "wb"):
        pass
    store.update(a.id, durable=False, reason="new log")
    store.sync()
    assert opened.count(wal) == 2 and os.fstat(store._wal).st_ino != kept
    store.close()


def test_exit_records_are_removed_only_after_the_end_is_synced(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The service defers the fsync of a job's end; the exit record that says how the
    job ended must outlive any window in which a power cut could lose that end."""
    from types import SimpleNamespace

    from gpuwarden.service.joblife import JobLife

    store = s.Store(str(tmp_path / "state.db"))
    a = store.add(job(state=s.RUNNING))
    record = tmp_path / f"{a.id}.exit"
    record.write_text("{}")
    store.update(a.id, durable=False, state=s.COMPLETED)
    order: list[str] = []
    real_sync = store.sync
    monkeypatch.setattr(store, "sync", lambda: (order.append("sync"), real_sync()))
    real_unlink = os.unlink
    monkeypatch.setattr(os, "unlink", lambda p: (order.append("unlink"), real_unlink(p)))
    service = SimpleNamespace(store=store, litter=[str(record)], litter_batches=0)
    JobLife.remove_litter(service)  # type: ignore[arg-type]
    assert order == ["sync", "unlink"] and not store.unsynced and not record.exists()
    assert service.litter_batches == 1


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
        st.tuples(st.just("later"), st.integers(1, 8), st.sampled_from(STATES)),
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
            continue
        was = store.get(int(a))  # type: ignore[call-overload]
        if was is not None and (was.state, b) not in TRANSITIONS:  # refused, nothing written
            with pytest.raises(IllegalMove, match=f"no move from {was.state} to {b}"):
                store.update(int(a), state=b, gpus=["GPU-1"])  # type: ignore[call-overload]
        elif op == "update":
            store.update(int(a), state=b, gpus=["GPU-1"], held=1)  # type: ignore[call-overload]
        elif op == "later":  # in memory now, in the journal with the next commit
            store.later(int(a), state=b, pid=int(a))  # type: ignore[call-overload]
        else:
            with pytest.raises(RuntimeError), store.transaction():
                store.update(int(a), state=b, reason="never")  # type: ignore[call-overload]
                raise RuntimeError("rolled back")
    with store.transaction(durable=False):
        pass  # a commit of nothing: it carries what `later` kept
    fresh = s.Store(path)  # reads every row from disk
    for states in (s.ACTIVE, (s.PENDING,), (s.STARTING, s.RUNNING)):
        assert store.jobs(states) == fresh.jobs(states)
    for job_id in range(1, 9):
        assert store.get(job_id) == fresh.get(job_id)
    store.close()
    fresh.close()


def _on_disk(path: str, job_id: int) -> tuple[object, ...]:
    """(state, pid) of a job as another connection reads it from the journal's file."""
    import sqlite3

    with contextlib.closing(sqlite3.connect(path)) as other:
        return tuple(
            other.execute("SELECT state, pid FROM jobs WHERE id = ?", (job_id,)).fetchone()
        )


def test_a_change_kept_for_the_next_commit_is_one_row_write_with_it(tmp_path: Path) -> None:
    """`later` (a RUNNING job's pid: its supervisor's marker has it for a restart)
    changes the job at once in memory and costs no commit: the next commit writes it,
    in the same statement as that job's own next change. Commits that are not durable
    one after the other cost BEGIN, what they write, COMMIT (the connection's
    `synchronous` is switched only when a commit asks for the other kind)."""
    path = str(tmp_path / "state.db")
    store = s.Store(path)
    a, b = store.add(job()).id, store.add(job()).id
    store.update(a, durable=False, state=s.STARTING, started=1.0)
    statements, commits = store.statements, store.commits
    store.update(b, durable=False, reason="Resources")
    assert (store.statements - statements, store.commits - commits) == (3, 1)
    statements, commits = store.statements, store.commits
    store.later(a, state=s.RUNNING, pid=4242)
    assert store.get(a).state == s.RUNNING and store.jobs([s.RUNNING])[0].pid == 4242  # type: ignore[union-attr]
    assert (store.statements, store.commits) == (statements, commits)
    assert _on_disk(path, a) == (s.STARTING, None)  # killed now: recovery reads the marker
    with pytest.raises(IllegalMove):
        store.later(a, state=s.STARTING)  # only by a move of service.states' table
    store.update(a, durable=False, state=s.COMPLETED, exit_code=0)
    assert store.statements - statements == 3  # BEGIN, one UPDATE of both, COMMIT
    assert _on_disk(path, a) == (s.COMPLETED, 4242)
    # Another job's commit carries it, and one that fails leaves it kept for the next.
    store.update(b, durable=False, state=s.STARTING, started=2.0)
    store.later(b, state=s.RUNNING, pid=99)
    with pytest.raises(RuntimeError), store.transaction(durable=False):
        store.charge("alice", 1.0, 0.0, DAY)
        raise RuntimeError("rolled back")
    assert store.get(b).state == s.RUNNING and store.usage(0.0, DAY) == {}  # type: ignore[union-attr]
    assert _on_disk(path, b) == (s.STARTING, None)
    assert store.tally().counts() == {"RUNNING": {"alice": 1}}  # read afresh, kept over
    store.charge("alice", 1.0, 0.0, DAY)
    assert _on_disk(path, b) == (s.RUNNING, 99) and store.usage(0.0, DAY) == {"alice": 1.0}
    store.later(b, pid=100)
    store.close()  # stopping writes what is kept
    assert _on_disk(path, b) == (s.RUNNING, 100)


def test_states_of_named_jobs_however_old(tmp_path: Path) -> None:
    store = s.Store(str(tmp_path / "state.db"))
    ids = [store.add(job(state=s.COMPLETED)).id for _ in range(1200)]
    store.update(ids[0], state=s.PENDING)  # requeued
    assert store.states([ids[0], ids[-1], 99999]) == {ids[0]: s.PENDING, ids[-1]: s.COMPLETED}
    assert len(store.states(ids)) == 1200  # more ids than SQLite takes in one statement


def test_the_figures_kept_as_jobs_change_are_those_counted_afresh(tmp_path: Path) -> None:
    """`tally()` (what `stats` and /metrics read) follows every change; a journal
    opened again counts the same from its rows. The ready jobs are the waiting ones
    not held, by id."""
    from gpuwarden.service.tally import Tally

    path = str(tmp_path / "state.db")
    store = s.Store(path)
    a = store.add(job(submitted=100.0))
    b = store.add(job(user="bob", uid=1001, held=True, submitted=100.0))
    c = store.add(job(user="bob", uid=1001, submitted=100.0))
    assert [j.id for j in store.ready()[0]] == [a.id, c.id]
    store.update(b.id, held=False)
    store.update(a.id, state=s.STARTING, started=100.5)
    store.update(a.id, state=s.RUNNING)
    store.update(c.id, state=s.STARTING, started=130.0)
    store.update(c.id, state=s.RUNNING)
    store.update(c.id, state=s.PENDING, started=None)  # queued again (requeue)
    store.update(c.id, state=s.STARTING, started=4000.0)
    store.update(c.id, state=s.RUNNING)
    store.update(a.id, state=s.COMPLETED, ended=200.0)
    assert [j.id for j in store.ready()[0]] == [b.id]
    kept = store.tally()
    assert kept.counts() == {"PENDING": {"bob": 1}, "RUNNING": {"bob": 1}}
    assert kept.wait_count == 2 and abs(kept.wait_sum - (0.5 + 3900.0)) < 1e-6
    afresh = Tally(s.Store(path).db)
    assert (afresh.counts(), afresh.waits, afresh.wait_count) == (
        kept.counts(),
        kept.waits,
        kept.wait_count,
    )
    assert kept.waits == [1, 1, 1, 1, 1, 1, 2, 2]  # cumulative: <= 1 s ... <= 1 day


def test_a_jobs_journal_work_by_counts(tmp_path: Path) -> None:
    """bench/journal.py's replay of what the service asks of its journal for one job
    (submit, pass, STARTING and its fsync, RUNNING, end), on this tree: 3 commits and
    12 SQL statements a job (24f33fd: 4 and 28, the `synchronous` setting switched
    around every commit, the RUNNING a commit of its own, usage read before each
    charge and by each pass, the bookings read by each pass)."""
    import json

    source = (Path(__file__).parent.parent / "bench" / "journal.py").read_text()
    replay = source.split('REPLAY = r"""', 1)[1].split('"""', 1)[0]
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).parent.parent / "src"))
    run = subprocess.run(
        [sys.executable, "-c", replay, "50", str(tmp_path / "state.db")],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    assert run.returncode == 0, run.stderr
    per = json.loads(run.stdout.strip().splitlines()[-1])
    assert per["commits"] <= 3.1, per
    assert per["statements"] <= 13, per
