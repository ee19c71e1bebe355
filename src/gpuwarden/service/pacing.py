"""When the service plans: at once when something may start, coalesced otherwise.

A scheduling pass looks at every waiting job, so its cost grows with the queue;
a submit must not (10,000 submissions into a growing queue once took 56 ms each
at the end against 3 ms into an empty one). Two kinds of change:

- `wake()`: something may start now (a job ended, a GPU is free for the new job,
  a job was released or cancelled). The next pass comes at once, but never
  sooner than `SPREAD` times the last pass's length after it ended, so passes
  take at most 1/(SPREAD+1) of the loop however fast such events come.
- `touch()`: only what `queue` shows may change (a held job, a job that cannot
  fit anywhere now, the clock moving on). The pass comes `REFRESH` times the
  last pass's length after the last one, and `STALE_AT_MOST` seconds after it
  at the latest: a pass that started jobs is long for what it planned, and a new
  job's priority must not wait on it for long. For 10,000 waiting jobs that is a
  pass every two seconds while submissions keep coming, as Slurm's own main and
  backfill passes run on an interval rather than per submit.

Pure bookkeeping over times the caller passes in; the loop asks `due` and
`wait`. The last and mean pass length are served by `stats` (`plan`), as
`sdiag` reports Slurm's.
"""

from __future__ import annotations

import math
from typing import Any

SPREAD = 4.0  # an urgent pass waits this many pass lengths after the previous one
REFRESH = 200.0  # a non-urgent pass waits this many: planning stays under 0.5% of the time
STALE_AT_MOST = 2.0  # seconds: what `queue` shows of a new job is never older than this


class Pacer:
    def __init__(self) -> None:
        self.urgent = True  # plan once at start
        self.stale = False
        self.last = 0.0  # seconds the last pass took
        self.ended = -math.inf  # monotonic time it ended
        self.total = 0.0
        self.count = 0

    def wake(self) -> None:
        """Something may start: plan as soon as the spread allows."""
        self.urgent = True

    def touch(self) -> None:
        """Only reasons and priorities may have changed: plan when next refreshing."""
        self.stale = True

    def at(self) -> float:
        """When the next pass is due (monotonic seconds); inf when none is wanted."""
        if self.urgent:
            return self.ended + SPREAD * self.last
        if self.stale:
            return self.ended + min(REFRESH * self.last, STALE_AT_MOST)
        return math.inf

    def due(self, now: float) -> bool:
        return now >= self.at()

    def wait(self, now: float, longest: float) -> float:
        """How long the loop may sleep before the next pass is due, `longest` at most."""
        return max(0.0, min(longest, self.at() - now))

    def begin(self) -> None:
        """A pass starts: it sees every change so far (one made during it wakes again)."""
        self.urgent = self.stale = False

    def planned(self, began: float, ended: float) -> None:
        """The pass that began at `began` ended at `ended`."""
        self.last = max(0.0, ended - began)
        self.ended = ended
        self.total += self.last
        self.count += 1

    def stats(self) -> dict[str, Any]:
        return {
            "last_seconds": self.last,
            "mean_seconds": self.total / self.count if self.count else 0.0,
            "count": self.count,
        }
