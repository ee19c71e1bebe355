"""The files an ended job leaves in the service's status directory (its exit record,
marker, reserved room and attached client's record), and when they go: once the
journal's record of its end is on disk, never before (they say how it ended).

They go at the loop's tick, at most `BATCH` a tick, once it is quiet (`due`: no job
ended since the last tick, or none waits to start), or once `KEEP_MOST` paths wait:
an unlink takes the directory's and the filesystem journal's locks, and on the way
from a freed GPU to the next start each one was time the next job waited; all of a
burst of ends at once would hold up the turn that removes them as long. Until then a
restart finds them beside ended jobs and removes them (service.recovery); a
requeued job's go when it is queued again (service.requeue).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterable

from gpuwarden.base.units import is_digits
from gpuwarden.service import attachment, exitrecord, spawn

#: The files of one job, by the function naming each in the status directory.
FILES = (
    exitrecord.exit_record_path,
    spawn.marker_path,
    exitrecord.reserve_path,
    attachment.client_path,
)
SUFFIXES = (
    exitrecord.EXIT_SUFFIX,
    spawn.MARKER_SUFFIX,
    exitrecord.RESERVE_SUFFIX,
    attachment.CLIENT_SUFFIX,
)


#: Paths kept at most while jobs keep ending (four a job): beyond, the oldest go at
#: the tick, `BATCH` at a time (an unlink costs ~0.1 ms: a turn of the loop is not
#: held up for long, and at one tick a second this outpaces any rate of ends).
KEEP_MOST = 4096
BATCH = 512


def due(kept: int, quiet: bool) -> int:
    """How many of the `kept` paths (the oldest) go now: a batch when the loop is
    `quiet` or too many wait, else none."""
    return min(kept, BATCH) if quiet or kept >= KEEP_MOST else 0


def of_job(status_dir: str, job_id: int) -> list[str]:
    """The paths of job `job_id`'s files (whether or not they exist)."""
    return [name(status_dir, str(job_id)) for name in FILES]


def left_by_ended(status_dir: str, active: Iterable[int]) -> list[str]:
    """The files of jobs not in `active` (a service killed before removing them leaves
    them); [] where the directory cannot be read."""
    live = {str(i) for i in active}
    try:
        names = os.listdir(status_dir)
    except OSError:
        return []
    found = []
    for name in names:
        job, dot, suffix = name.partition(".")
        if dot and "." + suffix in SUFFIXES and is_digits(job) and job not in live:
            found.append(os.path.join(status_dir, name))
    return found


def remove(paths: Iterable[str]) -> None:
    for path in paths:
        with contextlib.suppress(OSError):
            os.unlink(path)
