"""The files a supervisor makes before its job may run, made before its launch.

A job's supervisor makes the room of its exit record (service.exitrecord) and its
marker's data (service.marker) before the job may run, and those writes were on the
way from a start to the job's exec. They need nothing of the job but its number: the
status directory, the supervisor's pid and start time (the marker's data). So a
spare (service.forker) makes them while it waits for its launch (`stage`), under
names of its own (`.supervisor-PID-SINCE.room` and `.marker`: dot-prefixed, never a
job's `N.ending` or `N.started`, so no reading of markers or of ended jobs' files
takes one for a job's), and its launch only renames the room to the job's
(`Staged.take`); the marker keeps its staged name until the go-ahead gives it the
job's (service.spawn). A supervisor forked with its launch stages them then. One
that runs no job removes them (`Staged.discard`); a restart removes those whose
supervisor died (`left_by_dead`, by the pid and start time in the name: a live
spare's stay).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
from collections.abc import Callable
from dataclasses import dataclass

from gpuwarden.base.errors import UserError
from gpuwarden.files.safefiles import write_new
from gpuwarden.service import exitrecord

_NAME = re.compile(r"\.supervisor-(\d{1,10})-(\d{1,20})\.(room|marker)")


@dataclass
class Staged:
    """A spare's files in `status_dir`, and the marker's data written in one."""

    status_dir: str
    room: str
    marker: str
    mark: dict[str, int]

    def take(self, job: str) -> str:
        """The room becomes job `job`'s (replacing a leftover of an earlier run); the
        staged marker's path, for the go-ahead to name. UserError where the rename
        fails (the job is not run), its files removed."""
        try:
            os.rename(self.room, exitrecord.reserve_path(self.status_dir, job))
        except OSError as err:
            self.discard()
            raise UserError(f"cannot make the job's exit record room: {err.strerror}") from None
        return self.marker

    def discard(self) -> None:
        for path in (self.room, self.marker):
            with contextlib.suppress(OSError):
                os.unlink(path)


def stage(status_dir: str, pid: int, since: int) -> Staged:
    """Make the room and the marker's data of the supervisor `pid` (started at `since`)
    in `status_dir`, leftovers of an earlier one of that name replaced. UserError where
    they cannot be made (a full disk): its job is not run."""
    base = os.path.join(status_dir, f".supervisor-{pid}-{since}")
    mark = {"supervisor": pid, "since": since}
    staged = Staged(status_dir, base + ".room", base + ".marker", mark)
    staged.discard()
    try:
        write_new(staged.room, b" " * exitrecord.ROOM, 0o600)
        write_new(staged.marker, json.dumps(mark).encode(), 0o644)
    except OSError as err:
        staged.discard()
        raise UserError(f"cannot write the job's records in {status_dir}: {err.strerror}") from None
    return staged


def left_by_dead(status_dir: str, alive: Callable[[int, int], bool]) -> list[str]:
    """The paths of staged files in `status_dir` whose spare is not alive
    (`alive(pid, since)`, service.spawn's); [] where the directory cannot be read."""
    try:
        names = os.listdir(status_dir)
    except OSError:
        return []
    found = []
    for name in names:
        match = _NAME.fullmatch(name)
        if match and not alive(int(match.group(1)), int(match.group(2))):
            found.append(os.path.join(status_dir, name))
    return found
