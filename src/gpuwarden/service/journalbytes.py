"""A bound on what one user's waiting and running jobs hold in the journal.

Each job is bounded alone (service.admission: its command line, its environment) and
a user's jobs in number (`max_jobs_per_user`), but a thousand jobs of 256 KiB each
are 256 MB of journal, for ever. `service.max_journal_bytes_per_user` bounds their
sum: the text a user's queued or running jobs keep in the journal (an array's common
part once: service.arrayrows) plus what the submit adds, refused in one line naming
the setting. Admins are bound by none of it. Counted by SQLite over the user's
active rows, as `max_jobs_per_user` is counted.
"""

from __future__ import annotations

import json
import sqlite3
from typing import Optional

from gpuwarden.base.errors import UserError
from gpuwarden.base.units import format_size
from gpuwarden.planning import arrayspec
from gpuwarden.queueclient import protocol
from gpuwarden.service import store

#: What a row takes beyond its text: its numbers, times, state and index entries.
ROW = 256

_TEXT = "length(argv) + length(env) + length(request) + length(cwd) + ifnull(length(output), 0)"


def held(db: sqlite3.Connection, uid: int) -> int:
    """The journal bytes of `uid`'s queued and running jobs."""
    marks = ", ".join("?" for _ in store.ACTIVE)
    where = f"uid = ? AND state IN ({marks})"
    rows, text = db.execute(
        f"SELECT COUNT(*), ifnull(SUM({_TEXT} + length(params)), 0) FROM jobs WHERE {where}",
        (uid, *store.ACTIVE),
    ).fetchone()
    (shared,) = db.execute(
        "SELECT ifnull(SUM(length(body)), 0) FROM blobs WHERE hash IN "
        f"(SELECT DISTINCT shared FROM jobs WHERE {where} AND shared IS NOT NULL)",
        (uid, *store.ACTIVE),
    ).fetchone()
    return int(rows) * ROW + int(text) + int(shared)


def adds(sub: protocol.Submit, tasks: int) -> int:
    """The journal bytes a submit adds: its text once, a row per task."""
    request = {k: v for k, v in sub.gpus.__dict__.items() if v not in (None, ())}
    text = json.dumps(list(sub.argv)) + json.dumps(dict(sub.env)) + json.dumps(request)
    text += sub.cwd + (sub.output or "")
    params = arrayspec.sweep(sub.params) if sub.params else ()
    swept = sum(len(p.name) + len(v) + 6 for p in params for v in p.values)
    return len(text.encode("utf-8", "surrogatepass")) + swept + ROW * tasks


def check(db: sqlite3.Connection, uid: int, adding: int, bound: Optional[int]) -> None:
    """Refuse, in one line naming the setting, a submit that takes `uid`'s jobs over
    `bound` bytes of journal (None: no bound)."""
    if bound is None:
        return
    have = held(db, uid)
    if have + adding > bound:
        raise UserError(
            f"your queued and running jobs hold {format_size(have)} of the service's "
            f"journal and this one adds {format_size(adding)}, over the "
            f"{format_size(bound)} one user's may (service.max_journal_bytes_per_user); "
            "wait for some to end or cancel some"
        )
