"""History retention (service.archive): a year of jobs in a journal, the older half
moved to compressed archives, and `gpuwarden report` the same before and after.

The figures (journal and archive bytes per job) are printed; run
`pytest -s tests/test_archive.py` to see them.
"""

from __future__ import annotations

import json
import os
import random
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gpuwarden.base.errors import UserError
from gpuwarden.service import accounting, archive
from gpuwarden.service import store as st
from hermetic import hermetic
from repo import SRC

DAY = 86400.0
JOBS = 12000  # a year of a busy lab server's jobs: 33 a day
KEEP = 183 * DAY
#: Bytes one job may take: in the journal (its row, its run, indexes) and archived.
JOURNAL_PER_JOB = 1200
ARCHIVE_PER_JOB = 150


def _a_year(path: Path, now: float, jobs: int = JOBS) -> st.Store:
    journal = st.Store(str(path))
    rng = random.Random(7)
    users = [f"student{i}" for i in range(30)]
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": "/home/x", "LANG": "C.UTF-8"}
    env.update({f"VAR{i}": "v" * 20 for i in range(12)})
    with journal.transaction():
        for n in range(jobs):
            ended = now - 365 * DAY + (n + 0.5) * 365 * DAY / jobs
            started = ended - rng.uniform(60, 8 * 3600)
            user = rng.choice(users)
            job = st.new_job(
                uid=5000 + users.index(user),
                gid=100,
                user=user,
                argv=("python", "train.py", "--lr", f"{rng.random():.5f}", "--epochs", "30"),
                cwd=f"/home/{user}/project",
                env={**env, "HOME": f"/home/{user}"},
                umask=18,
                request={"count": rng.choice((1, 1, 2, 4))},
                state=st.COMPLETED,
                submitted=started - rng.uniform(0, 3600),
                started=started,
                ended=ended,
                exit_code=0,
                output=f"/home/{user}/project/gpuwarden-{n}.out",
            )
            added = journal.add(job)
            gpus = tuple(f"GPU-{i}" for i in range(added.count))
            held = added.count * (ended - started)
            accounting.record_run(
                journal.db, st.Job(**{**added.__dict__, "gpus": gpus}), ended, st.COMPLETED, held
            )
    return journal


def _report(db: sqlite3.Connection, state: str, now: float, per: str) -> list[object]:
    old = archive.runs(state, now - 400 * DAY, now)
    return accounting.report(db, now - 400 * DAY, now, "user", per, now, old)


def _size(db: sqlite3.Connection, path: Path) -> int:
    """The journal's bytes on disk once compacted (VACUUM, its log emptied)."""
    db.execute("VACUUM")
    db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    return sum(p.stat().st_size for p in path.parent.glob(path.name + "*"))


def test_a_year_of_jobs_keeps_half_a_year_in_the_journal_and_reports_the_same(
    tmp_path: Path,
) -> None:
    now = time.time()
    state = tmp_path / "state"
    state.mkdir()
    path = state / "jobs.db"
    journal = _a_year(path, now)
    before = {per: _report(journal.db, str(state), now, per) for per in ("month", "all")}
    whole = _size(journal.db, path)

    moved = 0
    while ids := archive.movable(journal.db, now - KEEP):
        archive.move(journal, str(state), ids)
        moved += len(ids)
    kept = journal.db.execute("SELECT COUNT(*), MIN(ended) FROM jobs").fetchone()
    assert kept[0] + moved == JOBS and kept[1] >= now - KEEP
    assert journal.db.execute("SELECT MIN(ended) FROM runs").fetchone()[0] >= now - KEEP
    after = {per: _report(journal.db, str(state), now, per) for per in ("month", "all")}
    assert after == before  # accounting reads the archives: nothing lost

    left = _size(journal.db, path)
    archived = sum(p.stat().st_size for p in (state / "archive").iterdir())
    print(
        f"a year of {JOBS} jobs: journal {whole / JOBS:.0f} B/job ({whole / 1e6:.1f} MB); "
        f"keeping {KEEP / DAY:.0f} days: journal {left / 1e6:.1f} MB, "
        f"archives {archived / moved:.0f} B/job ({archived / 1e6:.2f} MB)"
    )
    assert whole <= JOBS * JOURNAL_PER_JOB
    assert left <= kept[0] * JOURNAL_PER_JOB
    assert archived <= moved * ARCHIVE_PER_JOB
    journal.close()

    # `gpuwarden report --journal` (an admin's offline report) reads the archives too
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "gpuwarden",
            "report",
            "--journal",
            str(path),
            "--since",
            "400d",
            "--per",
            "all",
            "--format",
            "json",
        ],
        env={**hermetic(), "PYTHONPATH": str(SRC), "PATH": os.environ["PATH"]},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stderr
    shown = {r["name"]: r["jobs"] for r in json.loads(run.stdout)}
    assert shown == {r.name: r.jobs for r in before["all"]}  # type: ignore[attr-defined]


def test_a_damaged_archive_is_said_in_one_line(tmp_path: Path) -> None:
    folder = tmp_path / "archive"
    folder.mkdir()
    (folder / "history-0-10-1.jsonl.gz").write_bytes(b"not gzip")
    with pytest.raises(UserError) as err:
        list(archive.runs(str(tmp_path), 0, 100))
    assert "cannot read the history archive" in str(err.value) and "\n" not in str(err.value)


def test_jobs_others_depend_on_and_arrays_still_running_stay(tmp_path: Path) -> None:
    journal = st.Store(str(tmp_path / "jobs.db"))
    old = time.time() - 400 * DAY
    fields = dict(uid=1, gid=1, user="x", argv=("true",), cwd="/", env={}, umask=18, request={})
    done = journal.add(st.new_job(**fields, state=st.COMPLETED, ended=old))
    named = journal.add(st.new_job(**fields, state=st.COMPLETED, ended=old))
    first = journal.add(st.new_job(**fields, state=st.COMPLETED, ended=old, array_task=0))
    journal.update(first.id, array_job=first.id)
    journal.add(st.new_job(**fields, array_job=first.id, array_task=1))  # still waiting
    assert archive.movable(journal.db, time.time(), keep={named.id}) == [done.id]
    journal.close()


@pytest.mark.parametrize("step", ["commit", "rename", "sync"])
def test_a_crash_anywhere_in_a_batch_counts_each_run_exactly_once(
    tmp_path: Path, step: str
) -> None:
    """The service killed before the batch's commit, between it and the rename, or after
    it: the report counts every run once, before and after the next start settles the
    batch, and the next batch still moves what is left."""
    now = time.time()
    state = tmp_path / "state"
    state.mkdir()
    path = state / "jobs.db"
    journal = _a_year(path, now, jobs=300)
    before = _report(journal.db, str(state), now, "all")
    journal.close()
    child = os.fork()
    if child == 0:  # the service, killed at `step` (os._exit: no cleanup runs)
        try:
            mine = st.Store(str(path))
            crash = {"commit": (mine, "transaction"), "rename": (os, "rename")}
            crash["sync"] = (archive, "_sync")
            owner, name = crash[step]
            setattr(owner, name, lambda *a, **k: os._exit(9))
            archive.move(mine, str(state), archive.movable(mine.db, now - KEEP))
        finally:
            os._exit(1)
    assert os.waitstatus_to_exitcode(os.waitpid(child, 0)[1]) == 9
    journal = st.Store(str(path))  # the service starts again
    if step == "commit":  # not yet moved: the journal counts them, the file does not
        assert _report(journal.db, str(state), now, "all") == before
    archive.recover(journal, str(state))
    assert not list((state / "archive").glob("*.tmp"))
    assert _report(journal.db, str(state), now, "all") == before
    while ids := archive.movable(journal.db, now - KEEP):
        archive.move(journal, str(state), ids)
    assert _report(journal.db, str(state), now, "all") == before
    moved = journal.db.execute("SELECT COUNT(*) FROM jobs").fetchone()[0]
    assert moved < 300 and len(list((state / "archive").iterdir())) == 1
    journal.close()


def test_an_offline_waste_report_reads_the_archives(tmp_path: Path) -> None:
    """`gpuwarden report --journal J --waste` (an admin's offline report) counts the idle
    GPU-hours of a job `keep_history` moved away, from the archive's samples."""
    from gpuwarden.usage.efficiency import GpuUse

    now = time.time()
    state = tmp_path / "state"
    state.mkdir()
    journal = st.Store(str(state / "jobs.db"))
    ended = now - 20 * DAY
    with journal.transaction():
        job = journal.add(
            st.new_job(
                uid=5000,
                gid=100,
                user="alice",
                argv=("x",),
                cwd="/",
                env={},
                umask=18,
                request={"count": 2},
                state=st.COMPLETED,
                submitted=ended - 7200,
                started=ended - 3600,
                ended=ended,
            )
        )
        ran = st.Job(**{**job.__dict__, "gpus": ("GPU-0", "GPU-1")})
        run = accounting.record_run(journal.db, ran, ended, st.COMPLETED, 7200.0)
        busy = GpuUse("GPU-0", 3600.0, 3600.0 * 90, 3600.0, 1 << 30, 80 << 30, 1e6, "gpu")
        idle = GpuUse("GPU-1", 3600.0, 0.0, 0.0, 0, 80 << 30, 1e5, "gpu")
        accounting.save_use(journal.db, job.id, run, [busy, idle])
    archive.move(journal, str(state), archive.movable(journal.db, now - 10 * DAY))
    assert journal.db.execute("SELECT COUNT(*) FROM gpu_use").fetchone()[0] == 0
    journal.close()
    asked = ("report", "--journal", str(state / "jobs.db"), "--waste", "--since", "30d")
    run_cli = subprocess.run(
        [sys.executable, "-m", "gpuwarden", *asked, "--format", "json"],
        env={**hermetic(), "PYTHONPATH": str(SRC), "PATH": os.environ["PATH"]},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run_cli.returncode == 0, run_cli.stderr
    (row,) = json.loads(run_cli.stdout)
    assert row["name"] == "alice" and row["gpus_idle"] == 1 and row["jobs"] == 1, row
    assert row["held_hours"] == pytest.approx(2.0) and row["idle_hours"] == pytest.approx(1.0)
