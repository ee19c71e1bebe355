"""A Slurm job's output file, found through `scontrol show job` and read with care.

The file sits where the job's user chose, often a directory others can write:
it is opened without following a symbolic link and without blocking (a FIFO
in its place would hang the reader), must be a regular file, and must belong
to the job's user or to whoever runs `gpuwarden logs`; otherwise it is refused
with one line, so `gpuwarden logs` run by root never shows a file someone
planted under the job's output name.
"""

from __future__ import annotations

import errno
import os
import stat
import sys
import time

from gpuwarden.errors import UserError
from gpuwarden.slurm import tools
from gpuwarden.slurm.states import ENDED, state_word

CHUNK = 1 << 16
POLL = 0.5


def _uid(user_field: str) -> int:
    """scontrol's `UserId=alice(1001)` -> 1001; -1 when it cannot be read."""
    _head, _, rest = user_field.partition("(")
    digits = rest.rstrip(")")
    return int(digits) if digits.isdigit() else -1


def _open(path: str, job_uid: int) -> int:
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
        from gpuwarden.leases import owner_of

        os.close(fd)
        raise UserError(
            f"output file {path} belongs to {owner_of(st.st_uid)}, not to the job's user; "
            "refusing it"
        )
    return fd


def _copy(fd: int) -> int:
    n = 0
    while True:
        data = os.read(fd, CHUNK)
        if not data:
            return n
        sys.stdout.buffer.write(data)
        n += len(data)


def show(job: str, follow: bool = False) -> int:
    tools.check_id(job)
    info = tools.show_job(job)
    path = info.get("StdOut", "")
    if not path or path == "/dev/null":
        raise UserError(f"Slurm job {job} keeps no output file (StdOut={path or 'unset'})")
    job_uid = _uid(info.get("UserId", ""))
    fd = -1
    try:
        while True:
            if fd < 0:
                try:
                    fd = _open(path, job_uid)
                except FileNotFoundError:
                    fd = -1
            if fd >= 0:
                _copy(fd)
                sys.stdout.flush()
            state = state_word(info.get("JobState", ""))
            if not follow or state in ENDED:
                if fd < 0:
                    what = "yet" if state not in ENDED else "and the job has ended"
                    raise UserError(f"Slurm job {job}: no output file {path} {what}")
                return 0
            time.sleep(POLL)
            info = tools.show_job(job)
    finally:
        if fd >= 0:
            os.close(fd)
