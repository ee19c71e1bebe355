"""A job's marker: the file its supervisor names before the job may exec.

A restarted service that finds no marker for a job of this boot knows it never ran
and may queue it again without running it twice (service.recovery). Its name is what
says so: the marker's data (the supervisor's pid and start time, for a restart that
adopts a live supervisor) is staged while the service commits the start
(`stage_marker`), and after the go-ahead the name is given (`name_marker`, a rename)
before the job execs. Neither is waited onto the disk: a crash of the service keeps
both (the page cache outlives it), and a crash of the machine, which may lose them,
ends the job too; a restart after one takes a job with no marker for one that may
have run (service.boots). A marker whose data did not reach the disk reads as there
and unreadable (`read_marker`: {}), never as absent. The job's pid is added later
(`write_marker`).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from typing import Optional

from gpuwarden.base.errors import UserError
from gpuwarden.files.safefiles import (
    read_small,
    temporary_name,
    write_atomic,
    write_new,
)

MARKER_SUFFIX = ".started"


def marker_path(status_dir: str, job: str) -> str:
    return os.path.join(status_dir, f"{job}{MARKER_SUFFIX}")


def write_marker(
    status_dir: str, job: str, data: Mapping[str, object], durable: bool = True
) -> None:
    write_atomic(marker_path(status_dir, job), json.dumps(data), durable=durable)


def stage_marker(status_dir: str, job: str, data: Mapping[str, object]) -> str:
    """Write the marker's data to a temporary file (`name_marker` names it), before the
    go-ahead, so that after it only the name is left to give."""
    tmp = temporary_name(marker_path(status_dir, job))
    try:
        write_new(tmp, json.dumps(data).encode(), 0o644)
    except OSError as err:
        raise UserError(f"cannot write job marker {tmp}: {err.strerror}") from None
    return tmp


def name_marker(status_dir: str, job: str, staged: str) -> None:
    """Give the staged marker its name: from then on a job may have run."""
    path = marker_path(status_dir, job)
    try:
        os.rename(staged, path)
    except OSError as err:
        raise UserError(f"cannot write job marker {path}: {err.strerror}") from None


def read_marker(status_dir: str, job: str) -> Optional[dict[str, int]]:
    """The supervisor's marker ({"supervisor", "since", "pid"?}), or None: no supervisor
    was ever given the go-ahead for this job. A marker that is there but unreadable (its
    data lost to a power cut) is {}: the job may have run."""
    try:
        raw, _ = read_small(marker_path(status_dir, job), what="job marker")
        data = json.loads(raw)
    except FileNotFoundError:
        return None
    except (UserError, ValueError):
        return {}
    if not isinstance(data, dict):
        return {}
    return {k: v for k, v in data.items() if isinstance(v, int) and not isinstance(v, bool)}
