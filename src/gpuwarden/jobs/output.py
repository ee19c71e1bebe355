"""A job's output file, read with care, once or following it until the job ends.

The file sits where the job's user chose, often a directory others can write:
it is opened without following a symbolic link and without blocking (a FIFO
in its place would hang the reader), must be a regular file, and must belong
to the job's user or to whoever reads it; otherwise it is refused with one
line, so `gpuwarden logs` run by root never shows a file someone planted under
the job's output name. Used for the queue service's jobs and for Slurm's.
"""

from __future__ import annotations

import codecs
import errno
import os
import stat
import sys
import time
from collections.abc import Callable
from typing import Optional

from gpuwarden.base.errors import UserError

CHUNK = 1 << 16
POLL = 0.5


def open_output(path: str, job_uid: int) -> int:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        raise
    except OSError as err:
        if err.errno == errno.ELOOP:
            raise UserError(f"output file {path} is a symbolic link; refusing it") from None
        raise UserError(f"cannot read output file {path}: {err.strerror}") from None
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise UserError(f"output file {path} is not a regular file; refusing it")
    if st.st_uid not in (job_uid, os.geteuid()):
        from gpuwarden.files.safefiles import owner_name

        os.close(fd)
        raise UserError(
            f"output file {path} belongs to {owner_name(st.st_uid)}, not to the job's user; "
            "refusing it"
        )
    return fd


def copy_out(fd: int, decoder: Optional[codecs.IncrementalDecoder] = None) -> int:
    """Copy what the file has to stdout; through `decoder` with control characters
    shown as escapes (`safefiles.printable`, newlines kept) where given."""
    from gpuwarden.files.safefiles import printable

    n = 0
    while True:
        data = os.read(fd, CHUNK)
        if not data:
            return n
        if decoder is None:
            sys.stdout.buffer.write(data)
        else:
            lines = decoder.decode(data).split("\n")
            sys.stdout.write("\n".join(printable(line) for line in lines))
        n += len(data)


def _guarded(job_uid: int) -> Optional[codecs.IncrementalDecoder]:
    """Another user's output on a terminal (root's or an admin's `logs`) is shown with
    its escape sequences as text: a job must not rewrite the admin's screen or title.
    Its owner, and a pipe, get the bytes as they are."""
    if job_uid == os.getuid() or not sys.stdout.isatty():
        return None
    return codecs.getincrementaldecoder("utf-8")("replace")


def show(path: str, job_uid: int, ended: Callable[[], bool], follow: bool, what: str) -> int:
    """Print the file at `path`; with `follow`, keep printing what is appended until
    `ended()` says the job is over. `what` names the job in errors."""
    fd = -1
    decoder = _guarded(job_uid)
    try:
        while True:
            if fd < 0:
                try:
                    fd = open_output(path, job_uid)
                except FileNotFoundError:
                    fd = -1
            if fd >= 0:
                copy_out(fd, decoder)
                sys.stdout.flush()
            over = ended()
            if not follow or over:
                if fd >= 0:
                    copy_out(fd, decoder)  # what it wrote just before it ended
                    return 0
                when = "yet" if not over else "and the job has ended"
                raise UserError(f"{what}: no output file {path} {when}")
            time.sleep(POLL)
    finally:
        if fd >= 0:
            os.close(fd)


def tail(path: str, job_uid: int, lines: int = 20, limit: int = CHUNK) -> list[str]:
    """The last `lines` lines of the output file, read from at most its last `limit`
    bytes (a job that printed gigabytes costs one bounded read), decoded with
    replacement and made printable: `top`'s log pane and the assistants' log tool show
    them on a terminal or to a model. No file yet is an empty list."""
    from gpuwarden.files.safefiles import printable

    try:
        fd = open_output(path, job_uid)
    except FileNotFoundError:
        return []
    try:
        size = os.fstat(fd).st_size
        os.lseek(fd, max(0, size - limit), os.SEEK_SET)
        data = b""
        while len(data) < limit:
            chunk = os.read(fd, limit - len(data))
            if not chunk:
                break
            data += chunk
    finally:
        os.close(fd)
    text = data.decode("utf-8", "replace").replace("\r\n", "\n")
    found = text.split("\n")
    if size > limit and len(found) > 1:
        found = found[1:]  # the first line is cut where the read began
    if found and found[-1] == "":
        found.pop()
    return [printable(line) for line in found[-lines:]] if lines > 0 else []
