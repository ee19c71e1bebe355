"""A job's marker: the file its supervisor names, on disk, before the job may exec.

A restarted service that finds no marker for a job knows it never ran and may queue
it again without running it twice (service.spawn). Its name is what says so: the
marker's data (the supervisor's pid and start time, for a restart that adopts a
live supervisor) is staged while the service commits the start (`stage_marker`),
and after the go-ahead the name is given and put on disk (`sync_marker`: a rename
and one fsync of the directory) before the job execs. The data is not waited for:
it matters only while the supervisor lives, which a power cut ends; a marker whose
data did not reach the disk reads as there and unreadable (`read_marker`: {}),
never as absent. The job's pid is added later (`write_marker`).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from typing import Optional

from gpuwarden.base.errors import UserError
from gpuwarden.files.safefiles import (
    read_small,
    sync_directory,
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
    """Write the marker's data to a temporary file (`sync_marker` names it), before the
    go-ahead, so that after it only the name must reach the disk."""
    tmp = temporary_name(marker_path(status_dir, job))
    try:
        write_new(tmp, json.dumps(data).encode(), 0o644)
    except OSError as err:
        raise UserError(f"cannot write job marker {tmp}: {err.strerror}") from None
    return tmp


def sync_marker(status_dir: str, job: str, staged: str) -> None:
    """Give the staged marker its name, on disk: from then on a job may have run."""
    path = marker_path(status_dir, job)
    try:
        os.rename(staged, path)
    except OSError as err:
        raise UserError(f"cannot write job marker {path}: {err.strerror}") from None
    sync_directory(status_dir)


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
