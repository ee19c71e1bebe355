"""The files an ended job leaves in the service's status directory (its exit record,
marker, reserved room and attached client's record), and when they go: once the
journal's record of its end is on disk, never before (they say how it ended)."""

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
