"""The queue's figures, kept as its jobs change: jobs per state and user, and how long
each started job waited.

The exporter reads them with every `/metrics` (through `stats`); counting them in
the journal each time made a scrape grow with the queue and its history. The
journal (service.store) counts once when it opens, then tells the tally of each
change to a job it keeps in memory, so reading the figures costs the same at
10,000 waiting jobs as at none.
"""

from __future__ import annotations

import sqlite3
from typing import Any, Optional

#: Upper bounds (seconds) of the wait-time histogram: from an instant start to a day.
WAIT_BUCKETS = (1.0, 10.0, 60.0, 300.0, 1800.0, 3600.0, 4 * 3600.0, 86400.0)
_ACTIVE = ("PENDING", "STARTING", "RUNNING")  # service.store's


class Tally:
    def __init__(self, db: sqlite3.Connection) -> None:
        """Counted from the journal's table `jobs` once."""
        self.jobs: dict[str, dict[str, int]] = {}  # state -> user -> active jobs
        query = "SELECT state, user, COUNT(*) FROM jobs WHERE state IN (?, ?, ?) GROUP BY 1, 2"
        for state, user, count in db.execute(query, _ACTIVE):
            self.jobs.setdefault(state, {})[user] = int(count)
        from gpuwarden.service.accounting import wait_histogram

        # Cumulative counts per bound, their sum and count: Prometheus' histogram.
        self.waits, self.wait_sum, self.wait_count = wait_histogram(db, WAIT_BUCKETS)

    def change(self, old: Optional[Any], new: Optional[Any]) -> None:
        """A job (store.Job) was `old` and is `new` now (None: it was not there)."""
        for job, sign in ((old, -1), (new, 1)):
            if job is None:
                continue
            if job.state in _ACTIVE:
                users = self.jobs.setdefault(job.state, {})
                users[job.user] = left = users.get(job.user, 0) + sign
                if left <= 0:
                    del users[job.user]
            if job.started is not None:
                self._wait(job.started - job.submitted, sign)

    def _wait(self, seconds: float, sign: int) -> None:
        for i, bound in enumerate(WAIT_BUCKETS):
            if seconds <= bound:
                self.waits[i] += sign
        self.wait_sum += sign * seconds
        self.wait_count += sign

    def counts(self) -> dict[str, dict[str, int]]:
        """Active jobs per state and user: {"PENDING": {"alice": 2}, ...}."""
        return {state: dict(users) for state, users in self.jobs.items() if users}
