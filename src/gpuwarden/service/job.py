"""One job of the service's journal, as the service reads and writes it (service.store).

A frozen record: a change is a new `Job` the journal writes (`Store.update`), its
state changed only by a move of service.states.
"""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from typing import Any, Optional

from gpuwarden.service.arrayrows import Blobs, task_fields
from gpuwarden.service.states import PENDING, State


@dataclass(frozen=True)
class Job:
    """One row of the journal."""

    id: int
    uid: int
    gid: int
    user: str
    argv: tuple[str, ...]
    cwd: str
    env: Mapping[str, str]
    umask: int
    request: Mapping[str, Any]  # count, gpus, filters, mem: what selection needs
    state: State  # changed only by a move of service.states.TRANSITIONS (`Store.update`)
    submitted: float
    time_limit: Optional[float] = None
    nice: int = 0
    qos: float = 0.0
    held: bool = False
    after: tuple[int, ...] = ()
    output: Optional[str] = None
    attached: bool = False
    wait: bool = True
    reason: Optional[str] = None
    started: Optional[float] = None
    ended: Optional[float] = None
    gpus: tuple[str, ...] = ()
    mem: Optional[int] = None
    supervisor: Optional[int] = None
    pid: Optional[int] = None
    exit_code: Optional[int] = None
    exit_signal: Optional[int] = None
    error: Optional[str] = None
    cpu_seconds: Optional[float] = None  # from its cgroup, at its end (None: not accounted)
    mem_peak: Optional[int] = None  # bytes, likewise
    array_job: Optional[int] = None  # the id of the array it is a task of (service.arrays)
    array_task: Optional[int] = None  # its task id in that array
    array_throttle: Optional[int] = None  # tasks of its array that may run at once
    params: Mapping[str, str] = field(default_factory=dict)  # its values of a --param sweep
    begin: Optional[float] = None  # --begin: it waits until then (reason BeginTime)
    restarts: int = 0  # times it was queued again under its id (GPUWARDEN_RESTART_COUNT)
    retries: int = 0  # of those, after a failure (--max-retries)
    preemptions: int = 0  # of those or not, times it was preempted (service.preempting)
    account: Optional[str] = None  # --account: whose GPU-hours these are (service.accounts)

    @property
    def count(self) -> int:
        return int(self.request.get("count") or len(self.request.get("gpus") or ()) or 1)

    @property
    def preemptible(self) -> bool:  # submitted --preemptible (service.preempting)
        return bool(self.request.get("preemptible"))


JSON = {"argv", "env", "request", "after", "gpus", "params"}
BOOL = {"held", "attached", "wait"}
COLUMNS = [f.name for f in fields(Job)]  # one per table column


def normalised(job: Job) -> Job:
    """A job as read back from its row: lists as tuples, flags as bools."""
    changes: dict[str, Any] = {}
    for name in JSON:
        value = getattr(job, name)
        if isinstance(value, list):
            changes[name] = tuple(value)
    for name in BOOL:
        value = getattr(job, name)
        if not isinstance(value, bool):
            changes[name] = bool(value)
    return replace(job, **changes) if changes else job


def new_job(**fields: Any) -> Job:
    """A PENDING job with id 0 (the store assigns one) submitted now."""
    fields.setdefault("state", PENDING)
    fields.setdefault("submitted", time.time())
    return Job(id=0, **fields)


#: Columns added to `jobs` since schema 1 was first written, with their declarations:
#: a journal of an earlier gpuwarden gets them when it is opened (service.store `_add_columns`), so
#: its jobs keep running and queueing across the upgrade.
ADDED = {
    "array_job": "INTEGER",
    "array_task": "INTEGER",
    "array_throttle": "INTEGER",
    "params": "TEXT NOT NULL DEFAULT '{}'",
    "begin": "REAL",
    "restarts": "INTEGER NOT NULL DEFAULT 0",
    "retries": "INTEGER NOT NULL DEFAULT 0",
    "preemptions": "INTEGER NOT NULL DEFAULT 0",
    "account": "TEXT",
    "shared": "TEXT",  # an array task's common part, in `blobs` (service.arrayrows)
}


def changed(job: Job, changes: Mapping[str, Any]) -> Job:
    """`job` with `changes` (columns; `shared` is the row's alone): `dataclasses.replace`
    without its checks and `__init__`, a copy of the fields the caller's row holds."""
    new = object.__new__(Job)
    values = new.__dict__
    values.update(job.__dict__)
    values.update(changes)
    values.pop("shared", None)
    return normalised(new)


def row_to_job(row: sqlite3.Row, blobs: Optional[Blobs] = None) -> Job:
    """The job a row holds; an array task's common part from `blobs` (required then)."""
    values: dict[str, Any] = {}
    keys = row.keys()
    shared = row["shared"] if "shared" in keys else None
    if shared is not None:
        if blobs is None:
            raise ValueError(f"job {row['id']}: its shared part cannot be read here")
        user, task = row["user"], row["array_task"]
        values.update(task_fields(blobs.get(shared), row["id"], row["array_job"], task, user))
    for name in COLUMNS:
        if name in values or (name in ADDED and name not in keys):
            continue  # shared, or a journal not yet given the column (journalguard)
        value = row[name]
        if name in JSON:
            value = json.loads(value)
            if isinstance(value, list):
                value = tuple(value)
        elif name in BOOL:
            value = bool(value)
        values[name] = value
    return Job(**values)
