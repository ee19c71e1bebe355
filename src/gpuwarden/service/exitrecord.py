"""Writing a job's exit record so that a full disk cannot lose it.

The supervisor (service.spawn) makes the record's room before the job starts
(a file of `ROOM` blanks, service.staging) and writes the record into it when the job
ends and renames it into place (`write`), then waits for it to reach the disk while
the service, told of the end, reads it: no block is newly taken, so a
job that ends while the state directory's disk is full still leaves its record, and
a restart never takes a job that exited for one that was lost (service.unwritten
keeps the journal's side).

The room is not waited onto the disk: its blocks are taken by the `write` that
makes it (a filesystem with delayed allocation, ext4's or XFS's, reserves them
then and reports a full disk then; one without allocates them then), and the
record written over them later takes none. After a power cut a room means nothing
(its job died with the machine); the record is durable once `write` returns, and one
a power cut caught before then reads as none (its room's blanks).
"""

from __future__ import annotations

import errno
import json
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Optional

from gpuwarden.base.errors import UserError
from gpuwarden.files.safefiles import read_small, write_atomic

#: The room's size: a record is cut to fit (the error a job's start failed with is
#: at most 4 KB, its JSON escapes at most six times that).
ROOM = 8192
#: The record's name beside the job's marker.
EXIT_SUFFIX = ".exit"
#: The room an exit record is written into, made before the job starts (service.staging).
RESERVE_SUFFIX = ".ending"


@dataclass(frozen=True)
class Ended:
    """How a job ended: `code` for a normal exit, `signal` when killed; `error` when it
    never started (the reason, one line)."""

    code: Optional[int]
    signal: Optional[int]
    error: Optional[str]
    at: float

    @property
    def ok(self) -> bool:
        return self.code == 0 and self.error is None

    @property
    def shell_status(self) -> int:
        """The status a shell would report: the code, 128+signal, or 127 (never ran)."""
        if self.error is not None:
            return 127
        if self.signal is not None:
            return 128 + self.signal
        return self.code if self.code is not None else 1


def exit_record_path(status_dir: str, job: str) -> str:
    return os.path.join(status_dir, f"{job}{EXIT_SUFFIX}")


def reserve_path(status_dir: str, job: str) -> str:
    return os.path.join(status_dir, f"{job}{RESERVE_SUFFIX}")


def read_exit_record(status_dir: str, job: str) -> Optional[Ended]:
    """The exit status the supervisor wrote, or None while the job runs (or if the
    supervisor was killed before writing: the caller then knows only that it ended)."""
    try:
        raw, _ = read_small(exit_record_path(status_dir, job), what="exit record")
        if not raw.strip():  # the room's blanks: the record's data lost in a power cut
            return None
        data = json.loads(raw)
        code, sig, error = data.get("code"), data.get("signal"), data.get("error")
        return Ended(
            code=code if isinstance(code, int) else None,
            signal=sig if isinstance(sig, int) else None,
            error=str(error) if error is not None else None,
            at=float(data.get("at", 0.0)),
        )
    except FileNotFoundError:
        return None
    except (UserError, ValueError, TypeError, AttributeError):
        return Ended(None, None, "unreadable exit record", 0.0)


def encode(record: Mapping[str, object]) -> bytes:
    """The record as JSON that fits the room (a long error cut), blanks after it."""
    text = json.dumps(record)
    cut = str(record.get("error") or "")
    while len(text) > ROOM and cut:
        cut = cut[: len(cut) // 2]
        text = json.dumps({**record, "error": cut + " ..."})
    return text.encode("ascii").ljust(ROOM)  # json.dumps escapes to ASCII


def write(
    room: str, path: str, record: Mapping[str, object], told: Optional[Callable[[], None]] = None
) -> None:
    """Write `record` into the room, then rename it to `path` (a reader sees all of it
    or none), call `told` (the service is told of the end and reads the record while
    it goes to the disk), then wait for it to reach the disk; without the room, the
    ordinary way. A power cut before that leaves the room's blanks under `path`, which
    read as no record, as a record never written does."""
    raw = encode(record)
    named = False
    try:
        if len(raw) > ROOM:
            raise OSError(errno.EFBIG, "the record does not fit its room")
        fd = os.open(room, os.O_WRONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        try:
            os.pwrite(fd, raw, 0)
            os.rename(room, path)
            named = True
            if told is not None:
                told()
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError:
        write_atomic(path, raw.rstrip())
        if not named and told is not None:
            told()
