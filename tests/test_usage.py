"""The figures of `report` and `eff` from known runs and samples (gpuwarden.usage.report,
gpuwarden.usage.efficiency), and the journal's `runs` table: filled when an earlier
journal is opened, read in a fixed number of queries however long the history."""

from __future__ import annotations

import os
import sqlite3
import time
from datetime import datetime
from pathlib import Path

import pytest

from gpuwarden.service import accounting
from gpuwarden.service import store as st
from gpuwarden.usage import efficiency
from gpuwarden.usage import report as usage


def at(text: str) -> float:
    return datetime.fromisoformat(text).timestamp()


def run(job: int, user: str, gpus: int, queued: str, started: str, ended: str) -> usage.Run:
    s, e = at(started), at(ended)
    return usage.Run(job, user, "lab", None, gpus, gpus * (e - s), at(queued), s, e)


def test_a_run_over_midnight_counts_in_both_days_and_its_wait_in_the_first() -> None:
    runs = [
        run(1, "alice", 2, "2026-11-02T21:00", "2026-11-02T22:00", "2026-11-03T02:00"),
        run(2, "bob", 1, "2026-11-03T10:00", "2026-11-03T10:30", "2026-11-03T11:30"),
    ]
    since, until = at("2026-11-01T00:00"), at("2026-12-01T00:00")
    rows = usage.summarise(usage.keyed(runs, "user"), "day", since, until)
    got = {(r.period, r.name): r for r in rows}
    assert got["2026-11-02", "alice"].gpu_hours == pytest.approx(4.0)  # 2 GPUs x 2 h
    assert got["2026-11-03", "alice"].gpu_hours == pytest.approx(4.0)
    assert got["2026-11-02", "alice"].jobs == 1 and got["2026-11-03", "alice"].jobs == 0
    assert got["2026-11-02", "alice"].mean_wait == pytest.approx(3600)
    assert got["2026-11-03", "bob"].gpu_hours == pytest.approx(1.0)
    assert [r.period for r in rows] == sorted(r.period for r in rows)
    whole = usage.summarise(usage.keyed(runs, "user"), "all", since, until)
    assert {r.name: r.gpu_hours for r in whole} == pytest.approx({"alice": 8.0, "bob": 1.0})
    month = usage.summarise(usage.keyed(runs, "group"), "month", since, until)
    assert [(r.period, r.name, r.jobs) for r in month] == [("2026-11", "lab", 2)]


def test_the_window_clips_a_run_and_each_run_of_a_requeued_job_counts() -> None:
    runs = [
        run(7, "alice", 1, "2026-11-30T20:00", "2026-11-30T22:00", "2026-12-01T04:00"),
        run(7, "alice", 1, "2026-12-01T04:00", "2026-12-01T04:10", "2026-12-01T05:10"),
    ]
    rows = usage.summarise(usage.keyed(runs, "job"), "all", at("2026-12-01"), at("2026-12-02"))
    (row,) = rows
    assert row.gpu_hours == pytest.approx(4.0 + 1.0)  # from midnight on, both runs
    assert row.jobs == 1 and row.runs == 1  # only the second run started in the window
    assert row.mean_wait == pytest.approx(600)


def test_weeks_are_iso_weeks_and_p90_is_the_nearest_rank() -> None:
    starts, labels = usage.boundaries(at("2026-12-02"), at("2026-12-20"), "week")
    assert labels == ["2026-W49", "2026-W50", "2026-W51"]
    assert datetime.fromtimestamp(starts[0]).weekday() == 0
    assert usage.percentile([float(i) for i in range(1, 11)], 0.9) == 9.0
    assert usage.percentile([], 0.9) is None


def test_efficiency_of_a_job_with_an_idle_gpu_is_flagged() -> None:
    busy = idle = None
    for util in (80, 80, 80, 80):
        busy = efficiency.add(busy, "A", 10.0, util, 30 << 30, 80 << 30, 3000.0, "gpu")
        idle = efficiency.add(idle, "B", 10.0, 0, 0, 80 << 30, 600.0, "gpu")
    assert busy is not None and idle is not None
    assert efficiency.mean_util(busy) == pytest.approx(80)
    assert efficiency.mean_util(idle) == 0 and idle.busy_seconds == 0
    assert busy.energy == pytest.approx(12000) and busy.mem_peak == 30 << 30
    flags = efficiency.flags([busy, idle], ["0", "1"])
    assert "GPU 1 was never used" in flags
    assert not any(f.startswith("GPU 0") for f in flags)
    assert any("idle 50%" in f for f in flags) is False  # 50% busy: not "most of its time"
    shared = efficiency.add(None, "C", 10.0, None, 1 << 30, 20 << 30, None, "process")
    assert efficiency.mean_util(shared) is None
    assert efficiency.flags([shared], ["2"]) == [
        "GPU 2: memory peaked at 1024MiB of the 20.0GiB it held"
    ]


def test_waste_counts_the_idle_share_of_each_gpu() -> None:
    rows = [
        (1, 0, "alice", "p", "A", 3600.0, 3600.0, 3600.0),
        (1, 0, "alice", "p", "B", 3600.0, 3600.0, 0.0),
        (2, 0, "bob", "q", "C", 7200.0, 3600.0, 1800.0),
    ]
    found = {w.name: w for w in usage.waste(rows, "user")}
    assert found["alice"].held_hours == pytest.approx(2.0)
    assert found["alice"].idle_hours == pytest.approx(1.0) and found["alice"].gpus_idle == 1
    assert found["bob"].idle_hours == pytest.approx(1.0) and found["bob"].gpus_idle == 0


def test_an_earlier_journal_gets_a_run_for_every_ended_job(tmp_path: Path) -> None:
    path = str(tmp_path / "jobs.db")
    journal = st.Store(path)
    job = journal.add(
        st.new_job(
            uid=1, gid=1, user="alice", argv=("x",), cwd="/", env={}, umask=18, request={"count": 2}
        )
    )
    journal.update(job.id, state=st.STARTING, started=100.0, gpus=("A", "B"))
    journal.update(job.id, state=st.COMPLETED, ended=400.0)
    journal.close()
    db = sqlite3.connect(path)
    db.execute("DROP TABLE runs")  # as a journal written before it
    db.execute("DROP TABLE gpu_use")
    db.commit()
    db.close()
    again = st.Store(path)
    rows = accounting.runs_between(again.db, 0.0, 1000.0, 1000.0)
    assert [(r.job, r.user, r.gpus, r.gpu_seconds, r.state) for r in rows] == [
        (job.id, "alice", 2, 600.0, st.COMPLETED)
    ]
    again.close()
    assert st.Store(path).db.execute("SELECT COUNT(*) FROM runs").fetchone()[0] == 1  # once


def test_a_report_reads_a_long_history_in_a_fixed_number_of_queries(tmp_path: Path) -> None:
    """The guard of bench/report.py's figure: the report's work per run is Python over one
    query's rows, never a query per run (what made such reports grow slow)."""
    journal = st.Store(str(tmp_path / "jobs.db"))
    now = time.time()
    rows = [
        (
            i,
            0,
            1000,
            1000,
            f"u{i % 7}",
            f"p{i % 3}",
            1,
            3600.0,
            now - 9e5 + i,
            now - 8e5 + i,
            now - 8e5 + i + 3600,
            "COMPLETED",
        )
        for i in range(1, 20001)
    ]
    with journal.transaction():
        journal.db.executemany("INSERT INTO runs VALUES (?,?,?,?,?,?,?,?,?,?,?,?)", rows)
    statements: list[str] = []
    journal.db.set_trace_callback(statements.append)
    for by, per in (("user", "day"), ("account", "week"), ("group", "month")):
        statements.clear()
        found = accounting.report(journal.db, now - 30 * 86400, now, by, per, now)
        assert sum(r.runs for r in found) == 20000
        assert len(statements) <= 3, statements
    total = sum(r.gpu_hours for r in accounting.report(journal.db, 0, now, "user", "all", now))
    assert total == pytest.approx(20000.0)
    journal.close()
    assert os.path.exists(tmp_path / "jobs.db")


def test_a_sample_reads_the_machine_once_and_writes_the_journal_once_a_minute(
    tmp_path: Path,
) -> None:
    """The guard of bench/sampler.py's figure (0.04% of a core at 8 GPUs): one reading per
    sample whatever the number of jobs, sums in memory, a journal write per minute."""
    from types import SimpleNamespace

    from gpuwarden.service.sampler import FLUSH_EVERY, Sampler

    gpus = [
        SimpleNamespace(
            uuid=f"GPU-{i}",
            lost=False,
            utilization_gpu=80 if i == 0 else 0,
            memory_used=1 << 30,
            memory_total=80 << 30,
            power_draw=100.0,
            energy_consumed=None,
            mig_instances=(),
            processes=(),
        )
        for i in range(8)
    ]
    readings = []

    def read() -> object:
        readings.append(1)
        return SimpleNamespace(gpus=gpus)

    journal = st.Store(str(tmp_path / "jobs.db"))
    jobs = []
    for gpu in gpus:
        job = journal.add(
            st.new_job(
                uid=1,
                gid=1,
                user="alice",
                argv=("x",),
                cwd="/",
                env={},
                umask=18,
                request={"count": 1},
            )
        )
        journal.update(job.id, state=st.STARTING, started=0.0, gpus=(gpu.uuid,))
        journal.update(job.id, state=st.RUNNING)
        jobs.append(journal.get(job.id))
    statements: list[str] = []
    sampler = Sampler(10.0, read)
    sampler.flushed = 1000.0
    journal.db.set_trace_callback(statements.append)
    for step in range(1, 6):  # 50 s: no flush yet
        sampler.step(journal, jobs, 1000.0 + 10 * step, lambda job: set())
    assert len(readings) == 5
    assert not [s for s in statements if not s.startswith("SELECT")]  # nothing written
    sampler.step(journal, jobs, 1000.0 + FLUSH_EVERY + 10, lambda job: set())
    written = [s for s in statements if s.startswith("INSERT")]
    assert len(written) == 8  # one summary per running GPU
    (first,) = sampler.take(jobs[0].id)
    assert efficiency.mean_util(first) == pytest.approx(80)
    assert first.energy == pytest.approx(100.0 * first.seconds)
    journal.close()
