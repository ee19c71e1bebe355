"""History retention: ended jobs older than `service.keep_history` leave the journal
for compressed archives under the state directory, which `gpuwarden report` still reads.

Without it the journal grows with every job for ever. With it, the journal holds the
queue and the last `keep_history` of history (what `jobs` lists), and the rest lies in
`STATE/archive/history-FIRST-LAST-ID.jsonl.gz`: gzip'd JSON lines, one per journal row
as it was (the job's row, each of its runs, what its GPUs did, an array's common part
once per file), so nothing of it is lost and accounting reads it (`runs`). FIRST and
LAST are the earliest start and the latest end in the file (whole seconds), so a report
opens only the files its window overlaps.

A batch moves so that a crash at any point leaves each run in exactly one place: the
file is written durably under a temporary name (`NAME.tmp`, which readers skip); its
rows leave the journal in the same commit that records the batch's name in the journal
(`meta`); only then is the file renamed. At start (`recover`), a temporary file whose
batch is recorded is renamed (its rows are gone), and one that is not is removed (its
rows are still in the journal, which the next batch moves again). A job another
waiting job depends on (`--after`), and the tasks of an array some of whose tasks are
still queued or running, stay. tests/test_archive.py measures a year of jobs.
"""

from __future__ import annotations

import contextlib
import gzip
import json
import logging
import os
import re
import sqlite3
from collections.abc import Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

from gpuwarden.base.errors import UserError
from gpuwarden.service.states import ACTIVE, ENDED
from gpuwarden.service.store import Store

if TYPE_CHECKING:
    from typing import Protocol

    from gpuwarden.service.settings import Settings

    class Archiving(Protocol):
        """What archiving needs of the jobs' life (`joblife.JobLife` has it)."""

        settings: Settings
        store: Store
        archived_at: float  # when history is next looked at


#: Rows moved at most in one batch: a tick of the service stays short.
BATCH = 2000
#: Seconds between two looks for history to archive once none was left.
EVERY = 3600.0
FOLDER = "archive"
log = logging.getLogger("gpuwarden.serve")
_NAME = re.compile(r"^history-(\d+)-(\d+)-(\d+)\.jsonl\.gz$")
#: The journal's `meta` key that records a batch whose rows left it (`move`, `recover`).
_RECORD = "archive:"
_RUN_COLUMNS = "job, run, uid, gid, user, account, gpus, gpu_seconds, queued, started, ended, state"


def folder_of(state_dir: str) -> str:
    return os.path.join(state_dir, FOLDER)


def _marks(values: Sequence[Any]) -> str:
    return ", ".join("?" for _ in values)


def movable(db: sqlite3.Connection, before: float, keep: Iterable[int] = ()) -> list[int]:
    """Ids of ended jobs that ended before `before` and may leave the journal (at most
    BATCH, oldest first): none in `keep` (what waiting jobs depend on), none of an
    array with tasks still queued or running."""
    active = _marks(ACTIVE)
    query = (
        f"SELECT id FROM jobs WHERE state IN ({_marks(ENDED)}) AND ended < ? AND "
        "(array_job IS NULL OR array_job NOT IN (SELECT array_job FROM jobs WHERE "
        f"state IN ({active}) AND array_job IS NOT NULL)) ORDER BY id LIMIT ?"
    )
    kept = set(keep)
    rows = db.execute(query, (*ENDED, before, *ACTIVE, BATCH + len(kept)))
    return [int(r[0]) for r in rows if int(r[0]) not in kept][:BATCH]


def _dicts(cursor: sqlite3.Cursor) -> list[dict[str, Any]]:
    names = [d[0] for d in cursor.description]
    return [dict(zip(names, row)) for row in cursor]


def move(journal: Store, state_dir: str, ids: Sequence[int]) -> str:
    """Write jobs `ids` (their rows, runs, GPU use and common parts) to a new archive
    file, durably, then delete them from the journal in one commit; the file's path."""
    db = journal.db
    marks = _marks(ids)
    jobs = _dicts(db.execute(f"SELECT * FROM jobs WHERE id IN ({marks})", ids))
    runs = _dicts(db.execute(f"SELECT {_RUN_COLUMNS} FROM runs WHERE job IN ({marks})", ids))
    uses = _dicts(db.execute(f"SELECT * FROM gpu_use WHERE job IN ({marks})", ids))
    shared = sorted({j["shared"] for j in jobs if j.get("shared")})
    blobs = _dicts(
        db.execute(f"SELECT hash, body FROM blobs WHERE hash IN ({_marks(shared)})", shared)
    )
    starts = [r["started"] for r in runs] + [j["started"] or j["submitted"] for j in jobs]
    ends = [r["ended"] for r in runs] + [j["ended"] for j in jobs]
    first, last = int(min(starts)), int(max(ends)) + 1
    folder = folder_of(state_dir)
    os.makedirs(folder, mode=0o700, exist_ok=True)
    path = os.path.join(folder, f"history-{first}-{last}-{min(ids)}.jsonl.gz")
    tmp = path + ".tmp"
    with contextlib.suppress(FileNotFoundError):
        os.unlink(tmp)  # a crash's leftover
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    with os.fdopen(os.open(tmp, flags, 0o600), "wb") as raw:  # root's alone, as the journal
        with gzip.GzipFile(fileobj=raw, mode="wb", mtime=0) as out:
            for kind, rows in (("blob", blobs), ("job", jobs), ("run", runs), ("use", uses)):
                for row in rows:
                    out.write(json.dumps({"kind": kind, **row}).encode() + b"\n")
        raw.flush()
        os.fsync(raw.fileno())
    try:
        with journal.transaction():
            for table, column in (("gpu_use", "job"), ("runs", "job"), ("jobs", "id")):
                db.execute(f"DELETE FROM {table} WHERE {column} IN ({marks})", ids)
            db.execute(
                f"DELETE FROM blobs WHERE hash IN ({_marks(shared)}) AND hash NOT IN "
                "(SELECT shared FROM jobs WHERE shared IS NOT NULL)",
                shared,
            )
            db.execute(
                "INSERT OR REPLACE INTO meta (key, value) VALUES (?, 'moved')",
                (_RECORD + os.path.basename(path),),
            )
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)  # the rows stayed: the file would count them twice
        raise
    os.rename(tmp, path)
    _sync(folder)
    return path


def _sync(folder: str) -> None:
    """Make the folder's renames and removals durable."""
    with contextlib.suppress(OSError):
        fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def recover(journal: Store, state_dir: str) -> int:
    """Finish or undo the batch a crash interrupted (see above): a temporary archive
    whose batch the journal records is renamed to its name, any other is removed; how
    many were renamed."""
    folder = folder_of(state_dir)
    try:
        names = os.listdir(folder)
    except FileNotFoundError:
        return 0
    left = [name for name in names if name.endswith(".tmp")]
    if not left:
        return 0
    recorded = {
        str(key)[len(_RECORD) :]
        for (key,) in journal.db.execute(
            "SELECT key FROM meta WHERE substr(key, 1, ?) = ?", (len(_RECORD), _RECORD)
        )
    }
    renamed = 0
    for name in left:
        final = name[: -len(".tmp")]
        if _NAME.match(final) and final in recorded:
            os.rename(os.path.join(folder, name), os.path.join(folder, final))
            renamed += 1
            log.info("the archive %s of an interrupted batch is kept", final)
        else:
            os.unlink(os.path.join(folder, name))
    _sync(folder)
    return renamed


def files(state_dir: str, since: float = 0.0, until: float = float("inf")) -> list[str]:
    """The archive files that may hold runs between `since` and `until`, oldest first."""
    folder = folder_of(state_dir)
    try:
        names = os.listdir(folder)
    except FileNotFoundError:
        return []
    found = []
    for name in names:
        match = _NAME.match(name)
        if match and int(match.group(2)) >= since and int(match.group(1)) < until:
            found.append((int(match.group(3)), os.path.join(folder, name)))
    return [path for _, path in sorted(found)]


def rows(path: str) -> Iterator[dict[str, Any]]:
    """Every row of one archive file, as written; a damaged file in one line."""
    try:
        with gzip.open(path, "rb") as lines:
            for line in lines:
                row = json.loads(line)
                if not isinstance(row, dict):
                    raise ValueError("a line is not an object")
                yield row
    except (OSError, EOFError, ValueError) as err:
        raise UserError(f"cannot read the history archive {path}: {err}") from None


def tend(service: Archiving, now: float) -> int:
    """Move one batch of history older than `service.keep_history` to an archive, at
    most once every `EVERY` seconds while none is left (at once again while some is);
    how many jobs moved. A failure (a full disk) is logged and tried again later."""
    keep = service.settings.keep_history
    if keep is None or now < service.archived_at:
        return 0
    service.archived_at = now + EVERY
    depended = {a for job in service.store.jobs() for a in job.after}
    ids = movable(service.store.db, now - keep, depended)
    if not ids:
        return 0
    try:
        recover(service.store, service.settings.state_dir)  # a batch that failed half-way
        path = move(service.store, service.settings.state_dir, ids)
    except (OSError, sqlite3.Error) as err:
        log.warning("ended jobs could not be archived: %s", err)
        return 0
    if len(ids) == BATCH:
        service.archived_at = now  # more to move: the next tick goes on
    log.info("%d ended jobs moved from the journal to %s", len(ids), path)
    return len(ids)


def runs(state_dir: str, since: float, until: float) -> Iterator[dict[str, Any]]:
    """The archived runs that held GPUs between `since` and `until` (the columns of the
    journal's `runs`), each once: what accounting adds to the journal's own."""
    for run, _ in _runs_and_uses(state_dir, since, until):
        yield run


def uses(state_dir: str, since: float, until: float) -> Iterator[tuple[Any, ...]]:
    """What the GPUs of those archived runs did, as accounting's `use_between` rows
    (job, run, user, account, gpu, run seconds, sampled seconds, busy seconds): what
    `report --waste` adds to the journal's own."""
    for run, used in _runs_and_uses(state_dir, since, until):
        length = run["ended"] - run["started"]
        for use in used:
            yield (
                run["job"],
                run["run"],
                run["user"],
                run["account"],
                use["gpu"],
                length,
                use["seconds"],
                use["busy_seconds"],
            )


def _runs_and_uses(
    state_dir: str, since: float, until: float
) -> Iterator[tuple[dict[str, Any], list[dict[str, Any]]]]:
    """Each archived run in the window once (a batch written again after a crash holds
    it twice), with its GPUs' use rows (a job's runs and uses lie in one file)."""
    seen: set[tuple[int, int]] = set()
    for path in files(state_dir, since, until):
        found: dict[tuple[int, int], tuple[dict[str, Any], list[dict[str, Any]]]] = {}
        used = []
        for row in rows(path):
            kind = row.get("kind")
            if kind == "use":
                used.append(row)
            elif kind == "run" and row["ended"] >= since and row["started"] < until:
                key = (int(row["job"]), int(row["run"]))
                if key not in seen:
                    seen.add(key)
                    found[key] = (row, [])
        for use in used:
            hit = found.get((int(use["job"]), int(use["run"])))
            if hit is not None:
                hit[1].append(use)
        yield from found.values()
