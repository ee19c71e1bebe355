"""What the journal keeps for accounting: every run of every job, and what its GPUs did.

A requeued job runs more than once under one id (service.requeue), and its `jobs`
row holds only its current run. So each run that ends adds a row to `runs`, in the
same commit as its end: who ran it (uid, gid, account, as the job was submitted),
how many GPUs for how long, the GPU-seconds charged to fair share (a shared `--mem`
job counts the fraction of the card it declared), and when it entered the queue (the
submit for its first run, its previous run's end for the others), so that waits are
per run too. `gpuwarden report` sums these rows; `gpuwarden eff` reads `gpu_use`,
one row per run and GPU of what the sampler (service.sampler) saw: summaries, not
samples. `account_usage` is fair share's account level (gpuwarden.planning.fairshare): the
decayed GPU-seconds charged to each account and user, "" for jobs of no account.

The tables are made when a journal is opened; a journal of an earlier gpuwarden gets
a `runs` row for every job that ended in it (its last run: the earlier runs of a job
requeued then were never kept), so its history is reported too.
"""

from __future__ import annotations

import itertools
import json
import sqlite3
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple, Optional

from gpuwarden.usage.efficiency import GpuUse

if TYPE_CHECKING:
    from gpuwarden.service.job import Job

SCHEMA = """
CREATE TABLE IF NOT EXISTS runs (
    job INTEGER NOT NULL,
    run INTEGER NOT NULL,
    uid INTEGER NOT NULL,
    gid INTEGER NOT NULL,
    user TEXT NOT NULL,
    account TEXT,
    gpus INTEGER NOT NULL,
    gpu_seconds REAL NOT NULL,
    queued REAL NOT NULL,
    started REAL NOT NULL,
    ended REAL NOT NULL,
    state TEXT NOT NULL,
    PRIMARY KEY (job, run)
);
CREATE INDEX IF NOT EXISTS runs_ended ON runs (ended);
CREATE TABLE IF NOT EXISTS gpu_use (
    job INTEGER NOT NULL,
    run INTEGER NOT NULL,
    gpu TEXT NOT NULL,
    seconds REAL NOT NULL,
    util_seconds REAL,
    busy_seconds REAL,
    mem_peak INTEGER,
    mem_total INTEGER,
    energy REAL,
    level TEXT NOT NULL,
    PRIMARY KEY (job, run, gpu)
);
CREATE TABLE IF NOT EXISTS account_usage (
    account TEXT NOT NULL,
    user TEXT NOT NULL,
    value REAL NOT NULL,
    at REAL NOT NULL,
    PRIMARY KEY (account, user)
)
"""

#: A run's state when it ended by being queued again.
REQUEUED = "REQUEUED"


def ensure(db: sqlite3.Connection) -> None:
    """Make the tables (inside the opening transaction); fill `runs` from the ended jobs
    of a journal written before it."""
    had = db.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'runs'")
    fresh = had.fetchone() is None
    for statement in SCHEMA.split(";"):
        if statement.strip():
            db.execute(statement)
    if fresh:
        db.execute(
            "INSERT INTO runs (job, run, uid, gid, user, account, gpus, gpu_seconds, queued, "
            "started, ended, state) SELECT id, 0, uid, gid, user, account, "
            "json_array_length(gpus), json_array_length(gpus) * MAX(0, ended - started), "
            "submitted, started, ended, state FROM jobs "
            "WHERE started IS NOT NULL AND ended IS NOT NULL"
        )


def record_run(
    db: sqlite3.Connection, job: Job, ended: float, state: str, gpu_seconds: float
) -> int:
    """The run of `job` (a store.Job, still with its GPUs and start) that ended at `ended`
    as `state`: added inside the caller's transaction. Returns the run's number."""
    number, queued = 0, None  # its first run: nothing to look up (requeue counts runs)
    if job.restarts:
        number, queued = db.execute(
            "SELECT COUNT(*), MAX(ended) FROM runs WHERE job = ?", (job.id,)
        ).fetchone()
    started = job.started if job.started is not None else ended
    db.execute(
        "INSERT OR REPLACE INTO runs (job, run, uid, gid, user, account, gpus, gpu_seconds, "
        "queued, started, ended, state) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        (
            job.id,
            int(number),
            job.uid,
            job.gid,
            job.user,
            getattr(job, "account", None),
            len(job.gpus),
            max(0.0, gpu_seconds),
            job.submitted if queued is None else float(queued),
            started,
            max(started, ended),
            state,
        ),
    )
    return int(number)


def current_run(db: sqlite3.Connection, job_id: int) -> int:
    """The number the run now going of `job_id` will have (the runs ended before it)."""
    return int(db.execute("SELECT COUNT(*) FROM runs WHERE job = ?", (job_id,)).fetchone()[0])


class RunRow(NamedTuple):
    """One run as the report reads it."""

    job: int
    uid: int
    gid: int
    user: str
    account: Optional[str]
    gpus: int
    gpu_seconds: float
    queued: float
    started: float
    ended: float
    state: str


def runs_between(
    db: sqlite3.Connection, since: float, until: float, now: float, ended: bool = True
) -> list[RunRow]:
    """Every run that held GPUs between `since` and `until`: the ended ones from `runs`
    (unless not `ended`), the running ones from `jobs` (until `now`, as whole GPUs)."""
    rows: list[RunRow] = []
    if ended:
        query = (
            "SELECT job, uid, gid, user, account, gpus, gpu_seconds, queued, started, ended, "
            "state FROM runs WHERE ended >= ? AND started < ?"
        )
        rows = [RunRow(*r) for r in db.execute(query, (since, until))]
    have = {str(r[1]) for r in db.execute("PRAGMA table_info(jobs)")}
    account = "account" if "account" in have else "NULL"
    running = db.execute(
        f"SELECT id, uid, gid, user, {account}, json_array_length(gpus), submitted, started "
        "FROM jobs WHERE state IN ('STARTING', 'RUNNING') AND started IS NOT NULL "
        "AND started < ?",
        (until,),
    ).fetchall()
    for job, uid, gid, user, acct, gpus, submitted, started in running:
        queued = db.execute("SELECT MAX(ended) FROM runs WHERE job = ?", (job,)).fetchone()[0]
        span = max(0.0, now - started)
        rows.append(
            RunRow(
                job,
                uid,
                gid,
                user,
                acct,
                gpus,
                gpus * span,
                submitted if queued is None else queued,
                started,
                max(started, now),
                "RUNNING",
            )
        )
    return rows


def totals(db: sqlite3.Connection, ids: Sequence[int]) -> dict[int, tuple[int, float, float]]:
    """Job id -> (runs, seconds run, GPU-seconds) over every ended run of those jobs:
    what `jobs` shows of a requeued job."""
    out: dict[int, tuple[int, float, float]] = {}
    wanted = sorted(set(ids))
    for start in range(0, len(wanted), 500):  # under SQLite's limit on parameters
        chunk = wanted[start : start + 500]
        marks = ", ".join("?" for _ in chunk)
        query = (
            "SELECT job, COUNT(*), SUM(ended - started), SUM(gpu_seconds) FROM runs "
            f"WHERE job IN ({marks}) GROUP BY job"
        )
        for job, count, seconds, gpu_seconds in db.execute(query, chunk):
            out[int(job)] = (int(count), float(seconds or 0.0), float(gpu_seconds or 0.0))
    return out


def save_use(db: sqlite3.Connection, job: int, run: int, uses: Iterable[GpuUse]) -> None:
    for use in uses:
        db.execute(
            "INSERT OR REPLACE INTO gpu_use (job, run, gpu, seconds, util_seconds, busy_seconds, "
            "mem_peak, mem_total, energy, level) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (job, run, *use),
        )


def use_of(db: sqlite3.Connection, job: int) -> dict[int, list[GpuUse]]:
    """Run number -> its GPUs' use, for one job."""
    out: dict[int, list[GpuUse]] = {}
    query = (
        "SELECT run, gpu, seconds, util_seconds, busy_seconds, mem_peak, mem_total, energy, "
        "level FROM gpu_use WHERE job = ? ORDER BY run, gpu"
    )
    for run, *rest in db.execute(query, (job,)):
        out.setdefault(int(run), []).append(GpuUse(*rest))
    return out


def use_between(db: sqlite3.Connection, since: float, until: float) -> list[tuple[Any, ...]]:
    """(job, run, user, account, gpu, run seconds, sampled seconds, busy seconds) for
    every sampled GPU of a run that ended in the window: what `report --waste` sums."""
    return db.execute(
        "SELECT r.job, r.run, r.user, r.account, u.gpu, r.ended - r.started, u.seconds, "
        "u.busy_seconds FROM gpu_use u JOIN runs r ON r.job = u.job AND r.run = u.run "
        "WHERE r.ended >= ? AND r.started < ?",
        (since, until),
    ).fetchall()


def report(
    db: sqlite3.Connection,
    since: float,
    until: float,
    by: str,
    per: str,
    now: float,
    archived: Iterable[Mapping[str, Any]] = (),
) -> list[Any]:
    """`gpuwarden report`'s rows (gpuwarden.usage.report) from a journal: the ended runs read
    straight into what `usage.summarise` takes (one query, no object per row), those
    `archived` (service.archive: `runs`) beside them, the running jobs after them."""
    from gpuwarden.usage import report as usage

    column = {"user": "user", "group": "gid", "account": "COALESCE(account, '-')"}.get(by, "job")
    rows: Iterable[Sequence[Any]] = db.execute(
        f"SELECT job, {column}, gpu_seconds, queued, started, ended FROM runs "
        "WHERE ended >= ? AND started < ?",
        (since, until),
    )
    key = {"user": "user", "group": "gid", "account": "account"}.get(by, "job")
    old = ((r["job"], r[key] if key != "account" else r[key] or "-", *_spans(r)) for r in archived)
    rows = itertools.chain(rows, old)
    names = _group_names()
    if by == "group":
        rows = ((j, names(g), *rest) for j, g, *rest in rows)
    live = usage.keyed(
        (
            usage.Run(
                r.job,
                r.user,
                names(r.gid),
                r.account,
                r.gpus,
                r.gpu_seconds,
                r.queued,
                r.started,
                r.ended,
            )
            for r in runs_between(db, since, until, now, ended=False)
        ),
        by,
    )
    return usage.summarise(itertools.chain(rows, live), per, since, until)


def _spans(run: Mapping[str, Any]) -> tuple[Any, ...]:
    return run["gpu_seconds"], run["queued"], run["started"], run["ended"]


def waste_report(
    db: sqlite3.Connection,
    since: float,
    until: float,
    by: str,
    user: Optional[str] = None,
    archived: Iterable[Sequence[Any]] = (),
) -> list[Any]:
    """`gpuwarden report --waste`'s rows: the idle GPU-hours of runs that ended in the
    window, those `archived` (service.archive: `uses`) beside them, only `user`'s
    where given."""
    from gpuwarden.usage import report as usage

    rows: Iterable[Sequence[Any]] = itertools.chain(use_between(db, since, until), archived)
    if user is not None:
        rows = [r for r in rows if r[2] == user]
    return usage.waste(rows, by if by in ("user", "account", "job") else "user")


def _group_names() -> Any:
    """gid -> group name (the number where the system has none), looked up once each."""
    import grp

    known: dict[int, str] = {}

    def name(gid: int) -> str:
        if gid not in known:
            try:
                known[gid] = grp.getgrgid(gid).gr_name
            except KeyError:
                known[gid] = str(gid)
        return known[gid]

    return name


def wait_histogram(
    db: sqlite3.Connection, bounds: tuple[float, ...]
) -> tuple[list[int], float, int]:
    """How long every job that ever started waited: cumulative counts per upper bound
    (Prometheus' `le`), the sum and the count (the exporter's queue metrics)."""
    cases = ", ".join(f"SUM(started - submitted <= {float(b)!r})" for b in bounds)
    query = f"SELECT {cases}, SUM(started - submitted), COUNT(*) FROM jobs"
    row = db.execute(query + " WHERE started IS NOT NULL").fetchone()
    counts = [int(v or 0) for v in row[: len(bounds)]]
    return counts, float(row[len(bounds)] or 0.0), int(row[len(bounds) + 1])


def gpu_seconds_since(
    db: sqlite3.Connection, user: str, since: float, now: Optional[float] = None
) -> float:
    """GPU-seconds `user`'s jobs held after `since` (GPUs held x time, running jobs
    until `now`): what a weekly GPU-hour budget (service.limits) counts."""
    if now is None:
        import time

        now = time.time()
    rows = db.execute(
        "SELECT gpus, started, ended FROM jobs WHERE user = ? AND started IS NOT NULL "
        "AND (ended IS NULL OR ended > ?)",
        (user, since),
    )
    total = 0.0
    for gpus, started, ended in rows:
        span = (now if ended is None else ended) - max(started, since)
        total += len(json.loads(gpus)) * max(0.0, span)
    return total


def account_active(db: sqlite3.Connection, account: str) -> int:
    """Jobs charged to `account` queued or running."""
    query = "SELECT COUNT(*) FROM jobs WHERE account = ? AND state IN (?, ?, ?)"
    return int(db.execute(query, (account, "PENDING", "STARTING", "RUNNING")).fetchone()[0])


def account_gpu_seconds(db: sqlite3.Connection, account: str, since: float, now: float) -> float:
    """GPU-seconds the jobs of `account` held after `since`: its ended runs (the part of
    each after `since`) and its running jobs until `now`."""
    total = 0.0
    query = "SELECT gpu_seconds, started, ended FROM runs WHERE account = ? AND ended > ?"
    for gpu_seconds, started, ended in db.execute(query, (account, since)):
        length = ended - started
        if length > 0:
            total += gpu_seconds * (ended - max(started, since)) / length
    running = (
        "SELECT json_array_length(gpus), started FROM jobs WHERE account = ? "
        "AND state IN ('STARTING', 'RUNNING') AND started IS NOT NULL"
    )
    for gpus, started in db.execute(running, (account,)):
        total += gpus * max(0.0, now - max(started, since))
    return total


def totals_by(db: sqlite3.Connection) -> dict[tuple[str, str], float]:
    """(user, account or "") -> GPU-seconds of every ended run: the exporter's counters."""
    query = "SELECT user, COALESCE(account, ''), SUM(gpu_seconds) FROM runs GROUP BY 1, 2"
    return {(str(u), str(a)): float(s or 0.0) for u, a, s in db.execute(query)}
