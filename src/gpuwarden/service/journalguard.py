"""What keeps the service's journal from being opened wrong: damage, and a second service.

A journal that exists but cannot be read as one is never opened over (an empty
queue would silently replace all history and fair-share usage): it is moved aside,
a marker (`jobs.db.refused`) naming where it went is left in its place, and the
service refuses to start, now and at every start until an admin removes the marker,
in one line that says where the journal went and the command that starts again. The journal and
the socket are each locked for the life of the service, so a second `gpuwarden
serve` refuses to start instead of taking over the live socket and writing the
same journal.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import sqlite3
import stat
import time
from typing import Optional

from gpuwarden.base.errors import UserError
from gpuwarden.service.arrayrows import Blobs
from gpuwarden.service.store import ACTIVE, SCHEMA_VERSION, row_to_job


class JournalDamaged(UserError):
    """The journal exists and is not one this service can read: it was moved aside."""


def marker_of(path: str) -> str:
    """The file that keeps a service from starting over a journal it moved aside."""
    return path + ".refused"


def refuse_damaged(path: str) -> None:
    """Raise JournalDamaged, after moving it aside, if the journal at `path` is damaged;
    and on every start after that until an admin acts (removes the marker, after
    putting a repaired journal back or to start an empty queue): a restart by systemd
    two seconds later must not start an empty queue over the history."""
    marker = marker_of(path)
    try:
        with open(marker, encoding="utf-8", errors="replace") as fh:
            moved = fh.read(4096).strip() or "(unknown)"
    except FileNotFoundError:
        pass
    except OSError as err:
        raise JournalDamaged(
            f"cannot read {marker} ({err.strerror}); the service did not start"
        ) from None
    else:
        raise JournalDamaged(
            f"the journal {path} was found damaged and moved to {moved}; the service does "
            f"not start until an admin acts: `rm {marker}` to start with an empty queue "
            f"(first `mv {moved} {path}` to put back a repaired one)"
        )
    problem = examine(path)
    if problem is not None:
        raise JournalDamaged(f"{problem}; {set_aside(path)}")


def examine(path: str) -> Optional[str]:
    """What is wrong with the journal at `path` (None: nothing, or there is none yet):
    not a regular file, empty, not SQLite, failing SQLite's own check, not this
    service's (no schema mark), a newer schema, or rows that do not decode."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return None
    if not stat.S_ISREG(st.st_mode):
        return f"the journal {path} is not a regular file"
    if st.st_size == 0:
        return f"the journal {path} is empty (a journal holds at least its schema)"
    try:
        db = sqlite3.connect(f"file:{path}?mode=rw", uri=True, isolation_level=None)
    except sqlite3.Error as err:
        return f"the journal {path} cannot be opened ({err})"
    try:
        db.row_factory = sqlite3.Row
        check = [str(r[0]) for r in db.execute("PRAGMA quick_check")]
        if check != ["ok"]:
            return f"the journal {path} is damaged ({'; '.join(check[:2])})"
        tables = {str(r[0]) for r in db.execute("SELECT name FROM sqlite_master")}
        row = None
        if {"meta", "jobs"} <= tables:
            row = db.execute("SELECT value FROM meta WHERE key = 'schema'").fetchone()
        if row is None:
            return f"the journal {path} has no schema mark: not this service's journal"
        if not str(row[0]).isdigit() or int(row[0]) > SCHEMA_VERSION:
            return f"the journal {path} has schema {row[0]!r}, newer than this gpuwarden's"
        marks = ", ".join("?" for _ in ACTIVE)
        blobs = Blobs(db) if "blobs" in tables else None
        for r in db.execute(f"SELECT * FROM jobs WHERE state IN ({marks})", ACTIVE):
            row_to_job(r, blobs)  # what a start reads: every waiting or running job
        return None
    except (sqlite3.Error, ValueError, TypeError, KeyError, IndexError) as err:
        return f"the journal {path} is damaged ({err})"
    finally:
        db.close()


def set_aside(path: str) -> str:
    """Move a damaged journal (and its write-ahead log) aside; say where, in words."""
    moved = f"{path}.damaged-{time.strftime('%Y%m%dT%H%M%S')}-{os.getpid()}"
    os.rename(path, moved)
    for suffix in ("-wal", "-shm"):
        with contextlib.suppress(FileNotFoundError):
            os.rename(path + suffix, moved + suffix)
    marker = marker_of(path)
    fd = os.open(marker, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    try:
        os.write(fd, f"{moved}\n".encode())
        os.fsync(fd)
    finally:
        os.close(fd)
    return (
        f"moved it to {moved}; the service does not start until an admin acts: "
        f"`rm {marker}` to start with an empty queue (first `mv {moved} {path}` to put "
        "back a repaired one)"
    )


def lock(path: str, what: str) -> int:
    """An exclusive lock on `path` (made root's, 0600, never through a symlink) held by
    the returned descriptor for the life of the service, with our pid in it: a second
    service refuses in one line naming the pid of the first."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        if os.fstat(fd).st_uid != os.geteuid():
            raise UserError(f"{path} belongs to another user; refusing to use it as a lock")
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            held = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
            holder = f"pid {held}" if held.isdigit() else "another process"
            raise UserError(
                f"another gpuwarden serve ({holder}) is using {what}; refusing to start"
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    except BaseException:
        os.close(fd)
        raise
    return fd
