"""When the service plans: a start pass at once when something may start, a full pass
coalesced.

Two kinds of pass (service.passes `schedule`):

- a start pass, after `wake()`: something may start now (a job ended, a job was
  submitted that fits what is free, released, cancelled, a reload). It plans only
  the jobs that could start (not held, not waiting on a job still active), so its
  cost does not grow with a queue of held or dependent jobs, and it runs at the
  next turn of the loop: no delay stands between a freed GPU and the next start.
- a full pass, after `touch()`: only what `queue` shows may have changed (the
  priorities of every waiting job, their expected starts, a GPU freed outside the
  queue). It plans every waiting job, so it comes `REFRESH` times the last full
  pass's planning time after that pass, and `STALE_AT_MOST` seconds after it at
  the latest: for 10,000 waiting jobs a pass every two seconds while submissions
  keep coming, as Slurm's own main and backfill passes run on an interval rather
  than per submit. The first pass, at start, is a full one.

Pure bookkeeping over times the caller passes in; the loop asks `due` and `wait`.
The full passes' last and mean planning times and the count of each kind are
served by `stats` (`plan`), as `sdiag` reports Slurm's.
"""

from __future__ import annotations

import math
from typing import Any, Optional

REFRESH = 200.0  # a full pass waits this many of its lengths: under 0.5% of the time
STALE_AT_MOST = 2.0  # seconds: what `queue` shows of a new job is never older than this
START, FULL = "start", "full"


class Pacer:
    def __init__(self) -> None:
        self.urgent = False
        self.retried = False  # a start failed and its retry came (`retry`)
        self.stale = True  # a full pass once at start
        self.last = 0.0  # seconds the last full pass planned
        self.ended = -math.inf  # monotonic time it ended
        self.total = 0.0
        self.count = 0  # passes of both kinds
        self.full = 0
        self.looked = 0  # waiting jobs planned by start passes, all told
        self.surveyed = 0  # and by full passes
        self.deferred = 0  # turns of the loop that slept while a start pass was due
        self.turn = 0  # the loop's turns, counted by the loop
        self.woke = 0  # the turn in which a start pass became due
        self.late = 0  # passes run in a later turn than the event that made them due

    def wake(self) -> None:
        """Something may start: a start pass in this turn of the loop (after its events),
        or at the next one."""
        self._due()
        self.retried = False

    def _due(self) -> None:
        if not self.urgent:
            self.woke = self.turn
        self.urgent = True

    def retry(self) -> None:
        """A start failed as the machine moved under the plan: a start pass at once, but
        only once until something else happens (then the refresh), so that a machine
        that keeps refusing is not asked in a busy loop."""
        if self.retried:
            self.touch()
        else:
            self._due()
            self.retried = True

    def touch(self) -> None:
        """Only reasons and priorities may have changed: a full pass when next refreshing."""
        self.stale = True

    def refresh_at(self) -> float:
        """When the next full pass is due (monotonic seconds); inf when none is wanted."""
        if not self.stale:
            return math.inf
        return self.ended + min(REFRESH * self.last, STALE_AT_MOST)

    def due(self, now: float) -> Optional[str]:
        """FULL, START, or None: which pass is due now (a full one plans what a start
        pass would, and more)."""
        if now >= self.refresh_at():
            return FULL
        return START if self.urgent else None

    def wait(self, now: float, longest: float) -> float:
        """How long the loop may sleep before the next pass is due, `longest` at most."""
        if self.urgent:
            return 0.0
        return max(0.0, min(longest, self.refresh_at() - now))

    def begin(self, kind: str) -> None:
        """A pass starts: it sees every change so far (one made during it wakes again)."""
        if self.urgent and self.woke < self.turn:
            self.late += 1
        self.urgent = False
        if kind == FULL:
            self.stale = False

    def planned(self, kind: str, began: float, ended: float, jobs: int = 0) -> None:
        """The pass that began planning at `began` had planned `jobs` waiting jobs by
        `ended` (the jobs it starts are not planning: they do not space the next pass)."""
        self.count += 1
        if kind != FULL:
            self.looked += jobs
            return
        self.surveyed += jobs
        self.full += 1
        self.last = max(0.0, ended - began)
        self.ended = ended
        self.total += self.last

    def stats(self) -> dict[str, Any]:
        return {
            "last_seconds": self.last,
            "mean_seconds": self.total / self.full if self.full else 0.0,
            "count": self.count,
            "full": self.full,
            "starts": self.count - self.full,
            "start_planned": self.looked,
            "full_planned": self.surveyed,
            "deferred": self.deferred,
            "late": self.late,
        }
