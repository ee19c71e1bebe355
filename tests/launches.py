"""A supervisor's launch for tests that start jobs below the service (spawn, forker):
the caller's own uid, a bare PATH, records in `status_dir`."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from gpuwarden.service import spawn
from gpuwarden.service.identity import person


def launch(status_dir: Path, argv: list[str], job: str = "7", **extra: Any) -> spawn.JobStart:
    return spawn.JobStart(
        job=job,
        argv=tuple(argv),
        owner=person(os.getuid()),
        cwd=str(status_dir.parent),
        env={"PATH": "/usr/bin:/bin"},
        status_dir=str(status_dir),
        **extra,
    )
