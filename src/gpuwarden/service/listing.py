"""Pages of `queue` and `jobs`: every answer fits on the wire, whatever the queue holds.

A listing of thousands of jobs, or of a few with huge command lines, is answered a
page at a time: at most the rows the client asked for, and never more than
`protocol.PAGE_BYTES` of them, with the offset of the next page (`next`) while
rows are left and the number of rows that match (`total`). A command is cut to
`COMMAND_CHARS` in a listing (its owner has it whole in the journal), so that one
row never fills a page. The order is the table's: for `queue`, running jobs then
waiting ones by priority (as squeue lists them); for `jobs`, newest first.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Optional, TypeVar

from gpuwarden.queueclient import protocol
from gpuwarden.service import store

T = TypeVar("T")  # a job, or a row of jobs (service.arrays.grouped)

#: Characters of a job's command a listing shows; the rest is replaced by "…".
COMMAND_CHARS = 2048


def queue_order(jobs: Iterable[store.Job], priorities: Mapping[int, float]) -> list[store.Job]:
    """Running (and starting) jobs by id, then waiting ones by priority, oldest first
    among equals: the order `gpuwarden queue` prints."""
    running = [j for j in jobs if j.state != store.PENDING]
    waiting = [j for j in jobs if j.state == store.PENDING]
    running.sort(key=lambda j: j.id)
    waiting.sort(key=lambda j: (-(priorities.get(j.id) or 0.0), j.submitted, j.id))
    return running + waiting


def matching(jobs: Iterable[store.Job], ask: protocol.Listing) -> list[store.Job]:
    """The jobs a listing's filters keep (its user, its ids)."""
    ids = set(ask.ids)
    return [
        j for j in jobs if (ask.user is None or j.user == ask.user) and (not ids or j.id in ids)
    ]


def command(argv: Sequence[str]) -> list[str]:
    """A command as a listing shows it: whole up to COMMAND_CHARS, then cut with "…"."""
    shown: list[str] = []
    left = COMMAND_CHARS
    for word in argv:
        if len(word) > left:
            shown.append(word[:left] + "…")
            return shown
        shown.append(word)
        left -= len(word) + 1
    return shown


def page(
    jobs: Iterable[T],
    ask: protocol.Listing,
    total: int,
    row: Callable[[T], dict[str, Any]],
) -> dict[str, Any]:
    """The answer for `jobs`, the matching rows from `ask.offset` on in order: as many
    as `ask.limit` and PAGE_BYTES allow, with `next` when more are left."""
    rows: list[dict[str, Any]] = []
    size = 0
    for job in itertools.islice(jobs, ask.limit):  # decoded as taken: what fits
        shaped = row(job)
        cost = len(json.dumps(shaped, separators=(",", ":"))) + 1
        if rows and size + cost > protocol.PAGE_BYTES:
            break
        rows.append(shaped)
        size += cost
    end = ask.offset + len(rows)
    return {"ok": True, "jobs": rows, "total": total, "next": end if end < total else None}


def kept(
    listed: Optional[tuple[Any, list[store.Job]]],
    key: Any,
    journal: store.Store,
    ask: protocol.Listing,
    priorities: Mapping[int, float],
) -> tuple[Any, list[store.Job]]:
    """The queue's rows in `queue`'s order for `ask`, sorted again only when `key` (the
    journal's version and the passes so far) or the filters changed: the 21 pages of
    one `queue --all` over 10,000 jobs sort it once, not once a page."""
    key = (key, ask.user, ask.ids)
    if listed is not None and listed[0] == key:
        return listed
    return key, queue_order(matching(journal.jobs(store.ACTIVE), ask), priorities)
