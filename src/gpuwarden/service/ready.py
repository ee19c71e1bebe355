"""The waiting jobs a start pass may plan, kept in the order of their priorities, so a
pass after an event looks at the few that could start, not at the whole queue.

A start pass (service.pacing) plans the first `DEPTH` of the jobs ranked by the last
full pass's priorities, and the first `DEPTH` of those that came since (submitted,
released, queued again): at most twice `DEPTH` jobs whatever the queue's length, as
Slurm's scheduler after an event tries its `default_queue_depth` first jobs and
leaves the rest to its periodic passes. A full pass plans every waiting job and
ranks them again (`rank`). A job waiting on an active job (`--after`) is set aside
until that job ends (`ended`), so a long chain of dependent jobs costs a pass
nothing either.

Jobs leave lazily: one that started, was held or cancelled is dropped from the
ranking when a pass meets it, so each change costs a dictionary update, and each
job's removal is paid once.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from itertools import islice
from typing import Any

DEPTH = 100  # Slurm's default_queue_depth


class Ready:
    def __init__(self, jobs: Iterable[Any] = ()) -> None:
        """`jobs`: store.Job rows that are waiting and not held, oldest first."""
        self.jobs: dict[int, Any] = {}  # id -> job: every ready job
        self.ranked: list[int] = []  # ids by the last full pass's priorities (may hold left ones)
        self.fresh: dict[int, None] = {}  # ready since that pass, oldest first
        self.after: dict[int, list[int]] = {}  # active job -> ids set aside for it
        self.scanned = 0  # ids a pass looked at, all told (`stats`: work per event)
        for job in jobs:
            self.keep(job)

    def __len__(self) -> int:
        return len(self.jobs)

    def keep(self, job: Any) -> None:
        """`job` is ready (as it is now)."""
        if job.id not in self.jobs:
            self.fresh[job.id] = None
        self.jobs[job.id] = job

    def drop(self, job_id: int) -> None:
        """`job_id` is no longer ready (it started, was held, cancelled or ended)."""
        if self.jobs.pop(job_id, None) is not None:
            self.fresh.pop(job_id, None)

    def ended(self, job_id: int) -> None:
        """Active job `job_id` ended: what waited on it is looked at again."""
        for waiting in self.after.pop(job_id, ()):
            if waiting in self.jobs:
                self.fresh[waiting] = None

    def rank(self, priorities: Mapping[int, float]) -> None:
        """A full pass planned every waiting job: rank by its priorities, highest first
        (a job it did not plan, throttled or waiting for its client, last)."""
        low = float("-inf")
        jobs = self.jobs
        self.ranked = sorted(jobs, key=lambda i: (-priorities.get(i, low), jobs[i].submitted, i))
        self.fresh.clear()
        self.after.clear()

    def top(self, waits_on: Callable[[Any], int], depth: int = DEPTH) -> tuple[list[Any], bool]:
        """The first `depth` ranked jobs and the first `depth` fresh ones, oldest first;
        and whether more wait behind them. `waits_on(job)`: the id of an active job it
        depends on, or 0 (set aside until that one ends)."""
        chosen: list[Any] = []
        left: list[int] = []  # ids of the ranked prefix met that stay
        seen = 0
        for job_id in self.ranked:
            seen += 1
            job = self.jobs.get(job_id)
            if job is None or job_id in self.fresh:  # left, or ready again since
                continue
            if not self._set_aside(job, waits_on):
                left.append(job_id)
                chosen.append(job)
                if len(chosen) >= depth:
                    break
            # set aside: its dependency's end brings it back as fresh
        more = seen < len(self.ranked)
        self.ranked[:seen] = left
        self.scanned += seen
        taken: list[Any] = []  # the first fresh ones stay first in `fresh` until ranked
        while len(taken) < depth:
            batch = list(islice(self.fresh, len(taken), depth))
            if not batch:
                break
            self.scanned += len(batch)
            for job_id in batch:
                job = self.jobs[job_id]
                if self._set_aside(job, waits_on):
                    del self.fresh[job_id]
                else:
                    taken.append(job)
        more = more or len(self.fresh) > len(taken)
        chosen.extend(taken)
        chosen.sort(key=lambda j: j.id)
        return chosen, more

    def _set_aside(self, job: Any, waits_on: Callable[[Any], int]) -> bool:
        on = waits_on(job) if job.after else 0
        if on:
            self.after.setdefault(on, []).append(job.id)
        return bool(on)
