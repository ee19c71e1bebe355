"""One copy of what an array's tasks have in common, in the journal.

Every task of an array is a row of its own (service.arrays), but its command, its
environment, its request, its folder, its dependencies, its output pattern and its
`--param` sweep are the same for all of them: written into each row, one submit of
a 128 KiB environment or sweep wrote a gigabyte. So an array's common part is one
row of the `blobs` table, named by its hash, and each task's row names it in its
`shared` column (its own columns for those fields hold empty placeholders). A task's
values are made from it when the row is read: its `--param` values are the
combination its task id is in the product, its output path the pattern with its ids
filled in. A 10,000-task sweep then adds a few hundred bytes a task
(tests/test_service_arrays.py measures it).
"""

from __future__ import annotations

import collections
import hashlib
import json
import sqlite3
from collections.abc import Mapping, Sequence
from typing import Any, Optional

from gpuwarden.planning import arrayspec

#: The columns a shared row takes from its blob, and what they hold in the row itself.
PLACEHOLDERS: dict[str, Any] = {
    "argv": "[]",
    "env": "{}",
    "request": "{}",
    "cwd": "",
    "after": "[]",
    "output": None,
    "params": "{}",
}


def body(
    argv: Sequence[str],
    env: Mapping[str, str],
    request: Mapping[str, Any],
    cwd: str,
    after: Sequence[int],
    output: str,
    sweep: Sequence[arrayspec.Param],
) -> str:
    """The common part of an array's tasks, as the text stored once."""
    return json.dumps(
        {
            "argv": list(argv),
            "env": dict(env),
            "request": dict(request),
            "cwd": cwd,
            "after": list(after),
            "output": output,
            "sweep": [[p.name, list(p.values)] for p in sweep],
        },
        sort_keys=True,
    )


def digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def task_fields(
    common: Mapping[str, Any], job_id: int, array_job: Optional[int], task: Optional[int], user: str
) -> dict[str, Any]:
    """One task's values of the shared columns: its parameters and its output path."""
    sweep = [arrayspec.Param(str(n), tuple(v)) for n, v in common["sweep"]]
    index = int(task or 0)
    fills = {"A": job_id if array_job is None else array_job, "a": index, "j": job_id, "u": user}
    return {
        "argv": tuple(common["argv"]),
        "env": common["env"],
        "request": common["request"],
        "cwd": common["cwd"],
        "after": tuple(common["after"]),
        "output": arrayspec.output_path(common["output"], fills),
        "params": arrayspec.combination(sweep, index) if sweep else {},
    }


class Blobs:
    """The journal's shared parts, decoded once each: the tasks of an array read back
    share one environment and one request, in memory too."""

    def __init__(self, db: sqlite3.Connection, keep: int = 64) -> None:
        self.db = db
        self.keep = keep
        self.known: collections.OrderedDict[str, Mapping[str, Any]] = collections.OrderedDict()

    def put(self, text: str) -> str:
        """Store `text` (inside the caller's transaction) once; its name."""
        name = digest(text)
        self.db.execute("INSERT OR IGNORE INTO blobs (hash, body) VALUES (?, ?)", (name, text))
        self._remember(name, json.loads(text))
        return name

    def get(self, name: str) -> Mapping[str, Any]:
        found = self.known.get(name)
        if found is not None:
            self.known.move_to_end(name)
            return found
        row = self.db.execute("SELECT body FROM blobs WHERE hash = ?", (name,)).fetchone()
        if row is None:
            raise ValueError(f"the shared part {name} of an array is missing")
        common = json.loads(row[0])
        if not isinstance(common, dict):
            raise ValueError(f"the shared part {name} of an array is not an object")
        self._remember(name, common)
        return common

    def _remember(self, name: str, common: Mapping[str, Any]) -> None:
        self.known[name] = common
        self.known.move_to_end(name)
        while len(self.known) > self.keep:
            self.known.popitem(last=False)
