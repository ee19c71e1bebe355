"""A Slurm job's output files, found through `scontrol show job` and read with the care
gpuwarden.jobs.output takes with any file a job's user chose.

A batch job has two: `StdOut` and `StdErr` (sbatch's `--output`/`--error`). By default
they are one file, which already holds both streams merged as the job wrote them;
when they differ (submitit writes a failed job's traceback to its own `.err` file),
the job's stdout is copied to ours and its stderr to ours, so a terminal shows both
and a pipe can still separate them.
"""

from __future__ import annotations

import os
import sys
import time
from typing import BinaryIO

from gpuwarden.base.errors import UserError
from gpuwarden.base.units import is_digits
from gpuwarden.jobs import output
from gpuwarden.slurm import tools
from gpuwarden.slurm.states import ENDED, state_word


def _uid(user_field: str) -> int:
    """scontrol's `UserId=alice(1001)` -> 1001; -1 when it cannot be read."""
    _head, _, rest = user_field.partition("(")
    digits = rest.rstrip(")")
    return int(digits) if is_digits(digits) else -1


def streams(info: dict[str, str]) -> list[tuple[str, BinaryIO]]:
    """(file, where it goes) for each distinct output file the job keeps; one entry
    when stderr goes to the stdout file (Slurm's default)."""
    out, err = info.get("StdOut", ""), info.get("StdErr", "")
    found = []
    if out and out != "/dev/null":
        found.append((out, sys.stdout.buffer))
    if err and err != "/dev/null" and err != out:
        found.append((err, sys.stderr.buffer))
    return found


def _copy(fd: int, to: BinaryIO) -> None:
    while True:
        data = os.read(fd, output.CHUNK)
        if not data:
            to.flush()
            return
        to.write(data)


def show(job: str, follow: bool = False) -> int:
    tools.check_id(job)
    info = tools.show_job(job)
    files = streams(info)
    if not files:
        raise UserError(
            f"Slurm job {job} keeps no output file "
            f"(StdOut={info.get('StdOut') or 'unset'}, StdErr={info.get('StdErr') or 'unset'})"
        )
    uid = _uid(info.get("UserId", ""))
    fds: dict[str, int] = {}
    try:
        while True:
            for path, to in files:
                if path not in fds:
                    try:
                        fds[path] = output.open_output(path, uid)
                    except FileNotFoundError:
                        continue
                _copy(fds[path], to)
            over = state_word(info.get("JobState", "")) in ENDED
            if not follow or over:
                if not fds:
                    when = "yet" if not over else "and the job has ended"
                    raise UserError(f"Slurm job {job}: no output file {files[0][0]} {when}")
                for path, to in files:  # what it wrote just before it ended
                    if path in fds:
                        _copy(fds[path], to)
                return 0
            time.sleep(output.POLL)
            info = tools.show_job(job)
    finally:
        for fd in fds.values():
            os.close(fd)
