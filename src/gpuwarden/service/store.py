"""The service's journal: every job and every change of its state, in SQLite.

A state change is committed (WAL, `synchronous=FULL`: on disk when `commit`
returns) before it takes effect, so a service killed at any moment finds on
restart exactly what it had promised: waiting jobs in their order, running jobs
to re-adopt, ended jobs with their exit status. A job is marked STARTING before
its supervisor is forked; the supervisor leaves a marker before it forks the
job, so a restart can tell a job that never started (queued again) from one
that may have (adopted), and nothing runs twice.
"""

from __future__ import annotations

import contextlib
import json
import os
import sqlite3
from collections.abc import Iterable, Iterator, Mapping
from operator import attrgetter
from typing import Any, Optional

from gpuwarden.service import accounting, fairshare
from gpuwarden.service.arrayrows import PLACEHOLDERS, Blobs, task_fields
from gpuwarden.service.job import ADDED, BOOL, COLUMNS, JSON, changed, normalised
from gpuwarden.service.job import Job as Job
from gpuwarden.service.job import new_job as new_job
from gpuwarden.service.job import row_to_job as row_to_job
from gpuwarden.service.ready import Ready
from gpuwarden.service.states import ACTIVE as ACTIVE
from gpuwarden.service.states import CANCELLED as CANCELLED
from gpuwarden.service.states import COMPLETED as COMPLETED
from gpuwarden.service.states import ENDED as ENDED
from gpuwarden.service.states import FAILED as FAILED
from gpuwarden.service.states import LOST as LOST
from gpuwarden.service.states import PENDING as PENDING
from gpuwarden.service.states import PREEMPTED as PREEMPTED
from gpuwarden.service.states import RUNNING as RUNNING
from gpuwarden.service.states import STARTING as STARTING
from gpuwarden.service.states import TIMEOUT as TIMEOUT
from gpuwarden.service.states import check
from gpuwarden.service.tally import Tally
from gpuwarden.service.transaction import Transaction

_BUSY = (STARTING, RUNNING)

#: 2: an array's tasks share one copy of their common part (service.arrayrows).
SCHEMA_VERSION = 2

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS jobs (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    uid INTEGER NOT NULL,
    gid INTEGER NOT NULL,
    user TEXT NOT NULL,
    argv TEXT NOT NULL,
    cwd TEXT NOT NULL,
    env TEXT NOT NULL,
    umask INTEGER NOT NULL,
    request TEXT NOT NULL,
    time_limit REAL,
    nice INTEGER NOT NULL DEFAULT 0,
    qos REAL NOT NULL DEFAULT 0,
    held INTEGER NOT NULL DEFAULT 0,
    after TEXT NOT NULL DEFAULT '[]',
    output TEXT,
    attached INTEGER NOT NULL DEFAULT 0,
    wait INTEGER NOT NULL DEFAULT 1,
    state TEXT NOT NULL,
    reason TEXT,
    submitted REAL NOT NULL,
    started REAL,
    ended REAL,
    gpus TEXT NOT NULL DEFAULT '[]',
    mem INTEGER,
    supervisor INTEGER,
    pid INTEGER,
    exit_code INTEGER,
    exit_signal INTEGER,
    error TEXT,
    cpu_seconds REAL,
    mem_peak INTEGER,
    array_job INTEGER,
    array_task INTEGER,
    array_throttle INTEGER,
    params TEXT NOT NULL DEFAULT '{}',
    begin REAL,
    restarts INTEGER NOT NULL DEFAULT 0,
    retries INTEGER NOT NULL DEFAULT 0,
    preemptions INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX IF NOT EXISTS jobs_state ON jobs (state);
CREATE TABLE IF NOT EXISTS usage (user TEXT PRIMARY KEY, value REAL NOT NULL, at REAL NOT NULL);
CREATE TABLE IF NOT EXISTS blobs (hash TEXT PRIMARY KEY, body TEXT NOT NULL);
"""

_INDEXES = ("CREATE INDEX IF NOT EXISTS jobs_array ON jobs (array_job, array_task)",)


def _is_ready(job: Job) -> bool:
    return job.state == PENDING and not job.held


class Store:
    """The journal on disk. One writer: the service's single thread (which checks it
    first and locks it: service.journalguard)."""

    def __init__(self, path: str) -> None:
        self.path = path
        if path != ":memory:":
            os.makedirs(os.path.dirname(path) or ".", mode=0o700, exist_ok=True)
        # Made since opened (`stats`: per job started), statements too (SQLite counts them).
        self.commits = self.fsyncs = self.statements = self.rollbacks = 0
        self.db = sqlite3.connect(path, isolation_level=None, timeout=30.0)
        self.db.row_factory = sqlite3.Row
        self.db.set_trace_callback(self._counted)
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute("PRAGMA synchronous=FULL")
        self._durable = [True]  # the connection's `synchronous` (service.transaction)
        # job id -> columns changed in memory, written with the next commit (`later`); of
        # those, the ids the commit under way has written already.
        self._later: dict[int, dict[str, Any]] = {}
        self._written: set[int] = set()
        # Each user's usage, and each account's and user's, as last read or charged.
        self._usage = fairshare.Usage("usage", ("user",))
        self._accounts = fairshare.Usage("account_usage", ("account", "user"))
        self.db.execute("PRAGMA foreign_keys=ON")
        with self.transaction():
            for statement in _SCHEMA.split(";"):
                if statement.strip():
                    self.db.execute(statement)
            self.db.execute(
                "INSERT INTO meta (key, value) VALUES ('schema', ?) ON CONFLICT(key) "
                "DO UPDATE SET value = excluded.value WHERE value != excluded.value",
                (str(SCHEMA_VERSION),),
            )  # an earlier journal is this one once `_add_columns` has run
            self._add_columns()
            accounting.ensure(self.db)  # every run of every job, and what its GPUs did
        self.blobs = Blobs(self.db)
        if path != ":memory:":
            os.chmod(path, 0o600)
        # The active jobs, kept in memory as they are written: the service plans over
        # them on every pass, and reading and decoding every row each time made a pass
        # grow with the queue (a long queue's makespan grew with its square).
        self._active: Optional[dict[int, Job]] = None
        self._ready = Ready()  # of those, the waiting ones not held, ranked (`ready`)
        self._busy: dict[int, Job] = {}  # and those STARTING or RUNNING
        self._tally: Optional[Tally] = None  # the queue's figures, counted with them
        self.version = 0  # moves with every change to them (service.listing keeps by it)
        # Whether a commit made with `durable=False` may still be only in the page cache.
        self.unsynced = False
        self._wal = -1  # the write-ahead log, held open for `sync`

    def _add_columns(self) -> None:
        """The columns of `ADDED` a journal written before them lacks, and their indexes."""
        have = {str(r["name"]) for r in self.db.execute("PRAGMA table_info(jobs)")}
        for name, declared in ADDED.items():
            if name not in have:
                self.db.execute(f"ALTER TABLE jobs ADD COLUMN {name} {declared}")
        for statement in _INDEXES:
            self.db.execute(statement)

    def close(self) -> None:
        if self._later:  # what `later` kept, written as the service stops (a restart
            with contextlib.suppress(sqlite3.Error), self.transaction(durable=False):
                pass  # finds it in the supervisors' markers otherwise)
        self.sync()
        self.db.close()
        if self._wal >= 0:
            os.close(self._wal)
            self._wal = -1

    # -- transactions ------------------------------------------------------------

    def transaction(self, durable: bool = True) -> Transaction:
        """One commit for everything inside. `durable=False` for what may be lost to a
        power cut but never to a crash of the service (WAL keeps every commit across a
        process kill): the reason a job waits, its pid once RUNNING (its supervisor's
        marker has it too), a job's end until `sync` (its exit record stays on disk
        until then). Whatever decides what runs is written durably."""
        return Transaction(
            self.db, durable, self._forget, self._committed, self._durable, self._write_later
        )

    def _counted(self, _: str) -> None:
        self.statements += 1

    def _committed(self, durable: bool) -> None:
        # A durable commit fsyncs the whole write-ahead log: earlier commits with it.
        self.unsynced = not durable
        self.commits += 1
        self.fsyncs += durable
        for job_id in self._written:
            self._later.pop(job_id, None)
        self._written.clear()

    def sync(self) -> None:
        """Make every commit so far durable, if one made with `durable=False` is not.

        In WAL mode a `synchronous=FULL` commit is the same appends as a NORMAL one
        followed by an fsync of the log, so one fsync of the log here is what the
        last commit would have done. The service defers the fsync of a job's end to
        here or to the next job's start, whichever comes first: the way from a freed
        GPU to the next start then waits for one fsync, not two.
        """
        if not self.unsynced:
            return
        if self.path != ":memory:":
            fd = self._wal
            if fd >= 0 and os.fstat(fd).st_nlink == 0:  # removed (a last close): not ours
                os.close(fd)
                fd = self._wal = -1
            if fd < 0:  # opened once, kept while the log is there (not an open a sync)
                with contextlib.suppress(FileNotFoundError):  # checkpointed away: synced
                    fd = self._wal = os.open(self.path + "-wal", os.O_RDONLY | os.O_CLOEXEC)
            if fd >= 0:
                os.fdatasync(fd)  # as SQLite syncs its log: the data and its size
                self.fsyncs += 1
        self.unsynced = False

    def _forget(self) -> None:
        """Drop the in-memory active jobs and usage (after a rollback): read afresh when
        asked, with the changes `later` keeps over them."""
        self._active = None
        self._ready, self._busy = Ready(), {}
        self.rollbacks += 1  # what others keep of the journal is read again (bookings)
        self._written.clear()
        self._usage.forget()
        self._accounts.forget()

    def _actives(self) -> dict[int, Job]:
        if self._active is None:
            marks = ", ".join("?" for _ in ACTIVE)
            query = f"SELECT * FROM jobs WHERE state IN ({marks}) ORDER BY id ASC"
            active = {
                int(r["id"]): row_to_job(r, self.blobs) for r in self.db.execute(query, ACTIVE)
            }
            self._tally = Tally(self.db)
            for job_id, changes in self._later.items():  # not in the journal yet
                if job_id in active:
                    was = active[job_id]
                    active[job_id] = changed(was, changes)
                    self._tally.change(was, active[job_id])
            self._active = active
            self._ready = Ready(j for j in active.values() if _is_ready(j))
            self._busy = {i: j for i, j in active.items() if j.state in _BUSY}
            self.version += 1
        return self._active

    def tally(self) -> Tally:
        """Jobs per state and user, and the waits of started jobs (service.tally)."""
        self._actives()
        assert self._tally is not None
        return self._tally

    def _keep(self, job: Job, was: Optional[Job] = None) -> None:
        """`job` as it is now (`was` before), in memory (an ended one leaves) and tallied."""
        self.version += 1
        if self._tally is not None:
            self._tally.change(was, job)
        for kept, keep in ((self._active, job.state in ACTIVE), (self._busy, job.state in _BUSY)):
            if keep:
                kept[job.id] = job  # type: ignore[index]
            elif kept:
                kept.pop(job.id, None)
        self._ready.keep(job) if _is_ready(job) else self._ready.drop(job.id)
        if job.state not in ACTIVE:
            self._ready.ended(job.id)  # what waited on it may start

    def startable(self) -> int:
        """How many waiting jobs are not held: those a GPU freed may start."""
        self._actives()
        return len(self._ready)

    def waiting(self) -> list[Job]:
        """The waiting jobs that are not held, oldest first: kept in memory (`ready`)."""
        self._actives()
        return sorted(self._ready.jobs.values(), key=attrgetter("id"))

    def ready(self) -> tuple[list[Job], bool]:
        """What a start pass plans, first by priority, and whether more wait (service.ready)."""
        active = self._actives()
        return self._ready.top(lambda j: next((a for a in j.after if a in active), 0))

    def rank(self, priorities: Mapping[int, float]) -> None:
        """A full pass's priorities (job id -> priority): the order of the next start passes."""
        self._ready.rank(priorities)

    # -- jobs --------------------------------------------------------------------

    def share(self, text: str) -> str:
        """Store an array's common part (service.arrayrows) once; its name for `add`."""
        with self.transaction():
            return self.blobs.put(text)

    def add(self, job: Job, shared: Optional[str] = None) -> Job:
        """Record a new job (its id is assigned here) and return it; an array's task
        with its common part `shared` (from `share`) rather than in its own row."""
        values = {name: getattr(job, name) for name in COLUMNS if name != "id"}
        for name in JSON:
            values[name] = json.dumps(
                list(values[name]) if isinstance(values[name], tuple) else values[name]
            )
        for name in BOOL:
            values[name] = int(values[name])
        if shared is not None:
            values.update(PLACEHOLDERS, shared=shared)
        names = ", ".join(values)
        marks = ", ".join("?" for _ in values)
        with self.transaction():
            cursor = self.db.execute(
                f"INSERT INTO jobs ({names}) VALUES ({marks})", list(values.values())
            )
            added = changed(job, {"id": int(cursor.lastrowid or 0)})
            if shared is not None:
                common = self.blobs.get(shared)
                made = task_fields(common, added.id, job.array_job, job.array_task, job.user)
                added = changed(added, made)
            if self._active is not None and added.state in ACTIVE:
                self._keep(normalised(added))
        return added

    def update(self, job_id: int, durable: bool = True, **changes: Any) -> None:
        """Change columns of one job, committed before returning (see `transaction`); its
        `state` only by a move of service.states.TRANSITIONS (IllegalMove otherwise,
        and nothing written)."""
        if not changes:
            return
        for name in changes:
            if name not in COLUMNS or name == "id":
                raise ValueError(f"no job column {name!r}")
        if "state" in changes:  # only by a move of the table (service.states)
            was = self._state(job_id)
            if was is not None:
                check(job_id, was, changes["state"])
        if changes.keys() & PLACEHOLDERS.keys():  # a task's own value: its row holds all
            job = self.get(job_id)
            if job is not None:
                own = {n: changes.get(n, getattr(job, n)) for n in PLACEHOLDERS}
                changes = {**changes, **own, "shared": None}
        kept = self._later.get(job_id)  # one row write: what waited for a commit too
        with self.transaction(durable):
            self._write(job_id, changes if kept is None else {**kept, **changes})
            if kept is not None:
                self._written.add(job_id)
            if self._active is None:
                return
            known = self._active.get(job_id)
            if known is None:
                if changes.get("state") in ACTIVE:
                    self._active = None  # an ended job made active again: read afresh
                return
            self._keep(changed(known, changes), known)

    def later(self, job_id: int, **changes: Any) -> None:
        """Change columns of an active job now, in memory, and in the journal with the
        next commit, whoever makes it (or `close`): for what a service killed meanwhile
        finds again without the journal (a job's pid: its supervisor's marker has it,
        service.recovery), so it costs no commit of its own. Its `state` as `update`'s."""
        known = self._actives().get(job_id)
        if known is None or changes.keys() & PLACEHOLDERS.keys():
            self.update(job_id, durable=False, **changes)
            return
        for name in changes:
            if name not in COLUMNS or name == "id":
                raise ValueError(f"no job column {name!r}")
        if "state" in changes:
            check(job_id, known.state, changes["state"])
        self._later[job_id] = {**self._later.get(job_id, {}), **changes}
        self._written.discard(job_id)  # written again, whole, by the commit under way
        self._keep(changed(known, changes), known)

    def _write_later(self) -> None:
        """Inside a commit, last: the changes `later` kept that it has not written."""
        for job_id, changes in self._later.items():
            if job_id not in self._written:
                self._write(job_id, changes)
                self._written.add(job_id)

    def _write(self, job_id: int, changes: Mapping[str, Any]) -> None:
        values = [
            json.dumps(list(v) if isinstance(v, tuple) else v)
            if k in JSON
            else (int(v) if k in BOOL else v)
            for k, v in changes.items()
        ]
        sets = ", ".join(f"{k} = ?" for k in changes)
        self.db.execute(f"UPDATE jobs SET {sets} WHERE id = ?", [*values, job_id])

    def _state(self, job_id: int) -> Optional[str]:
        known = self._actives().get(job_id)
        if known is not None:
            return known.state
        row = self.db.execute("SELECT state FROM jobs WHERE id = ?", (job_id,)).fetchone()
        return None if row is None else str(row[0])

    def get(self, job_id: int) -> Optional[Job]:
        known = self._actives().get(job_id)
        if known is not None:
            return known
        row = self.db.execute("SELECT * FROM jobs WHERE id = ?", (job_id,)).fetchone()
        return None if row is None else row_to_job(row, self.blobs)

    def jobs(self, states: Iterable[str] = ACTIVE, limit: Optional[int] = None) -> list[Job]:
        """Jobs in the given states, oldest first (ended ones newest first, for history)."""
        states = tuple(states)
        if limit is None and set(states) <= set(ACTIVE):
            kept = self._actives()  # by id
            if PENDING not in states:  # the running ones: a few (`_busy`)
                busy = (j for j in self._busy.values() if j.state in states)
                return sorted(busy, key=attrgetter("id"))
            return [j for j in kept.values() if j.state in states]
        marks = ", ".join("?" for _ in states)
        order = "DESC" if set(states) <= set(ENDED) else "ASC"
        query = f"SELECT * FROM jobs WHERE state IN ({marks}) ORDER BY id {order}"
        if limit is not None:
            query += f" LIMIT {int(limit)}"
        return [row_to_job(r, self.blobs) for r in self.db.execute(query, states)]

    def history(
        self, limit: int, offset: int = 0, user: Optional[str] = None, ids: Iterable[int] = ()
    ) -> tuple[Iterator[Job], int]:
        """Ended jobs newest first: `limit` of them from `offset` on, only `user`'s and
        only `ids` where given, decoded as they are taken (a page takes what fits); and
        how many match in all (for paging)."""
        where = f"state IN ({', '.join('?' for _ in ENDED)})"
        args: list[Any] = list(ENDED)
        if user is not None:
            where += " AND user = ?"
            args.append(user)
        wanted = sorted(set(ids))
        if wanted:  # at most protocol.MAX_IDS: under SQLite's limit on parameters
            where += f" AND id IN ({', '.join('?' for _ in wanted)})"
            args.extend(wanted)
        total = int(self.db.execute(f"SELECT COUNT(*) FROM jobs WHERE {where}", args).fetchone()[0])
        query = f"SELECT * FROM jobs WHERE {where} ORDER BY id DESC LIMIT ? OFFSET ?"
        rows = self.db.execute(query, [*args, int(limit), int(offset)])
        return (row_to_job(r, self.blobs) for r in rows), total

    def states(self, ids: Iterable[int]) -> dict[int, str]:
        """Job id -> state, for the ids that exist (a waiting job's dependencies)."""
        wanted = sorted(set(ids))
        found: dict[int, str] = {}
        for start in range(0, len(wanted), 500):  # under SQLite's limit on parameters
            chunk = wanted[start : start + 500]
            marks = ", ".join("?" for _ in chunk)
            query = f"SELECT id, state FROM jobs WHERE id IN ({marks})"
            found.update((int(i), str(state)) for i, state in self.db.execute(query, chunk))
        return found

    def tasks(self, array: int, task: Optional[int] = None) -> list[Job]:
        """The tasks of array `array` by task id (only task `task` where given)."""
        query = "SELECT * FROM jobs WHERE array_job = ?"
        args: list[int] = [array]
        if task is not None:
            query += " AND array_task = ?"
            args.append(task)
        rows = self.db.execute(query + " ORDER BY array_task ASC", args).fetchall()
        actives = self._actives()
        return [actives.get(int(r["id"])) or row_to_job(r, self.blobs) for r in rows]

    def array_span(self, array: int) -> tuple[int, int, int]:
        """How many tasks array `array` has, and its lowest and highest task ids."""
        query = "SELECT COUNT(*), MIN(array_task), MAX(array_task) FROM jobs WHERE array_job = ?"
        count, low, high = self.db.execute(query, (array,)).fetchone()
        return int(count), int(low or 0), int(high or 0)

    def count_active(self, uid: int) -> int:
        row = self.db.execute(
            "SELECT COUNT(*) FROM jobs WHERE uid = ? AND state IN (?, ?, ?)", (uid, *ACTIVE)
        ).fetchone()
        return int(row[0])

    # -- usage (service.fairshare) ------------------------------------------------

    def usage(self, now: float, half_life: float) -> dict[str, float]:
        return self._usage.decayed(self.db, now, half_life)

    def charge(self, user: str, amount: float, now: float, half_life: float) -> None:
        with self.transaction():
            self._usage.charge(self.db, user, amount, now, half_life)

    def account_usage(self, now: float, half_life: float) -> dict[tuple[str, str], float]:
        """(account or "", user) -> usage decayed to `now`: the plan's account level."""
        return self._accounts.decayed(self.db, now, half_life)

    def charge_account(
        self, account: Optional[str], user: str, amount: float, now: float, half_life: float
    ) -> None:
        """Add GPU-seconds to what `user` used through `account`."""
        with self.transaction():
            self._accounts.charge(self.db, (account or "", user), amount, now, half_life)
