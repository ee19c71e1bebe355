"""GPU usage summed by who and when: the figures of `gpuwarden report` (as sreport).

Pure: runs in (from the service's journal, an archived one, or Slurm's `sacct`),
rows out. A run's GPU-hours are split across the periods it spans (a job running
over midnight counts in both days) and clipped to the window asked for; its job
and its wait count in the period it started in. A requeued job's runs each count
their GPU-hours and their wait (from the moment it was queued again); the job
counts once per period. Periods are the machine's local calendar: days from
midnight, ISO weeks from Monday, months from the 1st.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Iterable, Iterator, Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any, NamedTuple, Optional

#: What a report groups by, and the periods it splits time into.
BY = ("user", "group", "account", "job")
PER = ("day", "week", "month", "all")
#: A report's rows at most: more is refused in one line (narrow the window or the period).
MAX_ROWS = 5000
COLUMNS = ("period", "name", "gpu_hours", "jobs", "runs", "mean_wait", "p90_wait")


class Run(NamedTuple):
    """One run of a job, as every source gives it."""

    job: Any  # its id (12, or Slurm's "4711_3")
    user: str
    group: str
    account: Optional[str]
    gpus: int
    gpu_seconds: float  # over the whole run
    queued: float  # when it (last) entered the queue
    started: float
    ended: float


class Row(NamedTuple):
    period: str
    name: str
    gpu_hours: float
    jobs: int
    runs: int
    mean_wait: Optional[float]  # seconds
    p90_wait: Optional[float]


def boundaries(since: float, until: float, per: str) -> tuple[list[float], list[str]]:
    """The starts of the periods that meet [since, until) and their labels (`2026-12-07`,
    `2026-W49`, `2026-12`); one period `all` for the whole window."""
    if per == "all":
        return [since], ["all"]
    start = datetime.fromtimestamp(since).replace(hour=0, minute=0, second=0, microsecond=0)
    if per == "week":
        start -= timedelta(days=start.weekday())
    elif per == "month":
        start = start.replace(day=1)
    starts: list[float] = []
    labels: list[str] = []
    at = start
    while at.timestamp() < until:
        starts.append(at.timestamp())
        if per == "day":
            labels.append(at.strftime("%Y-%m-%d"))
            at = (at + timedelta(days=1, hours=2)).replace(hour=0)  # a DST day may be 23 h
        elif per == "week":
            year, week, _ = at.isocalendar()
            labels.append(f"{year}-W{week:02d}")
            at = (at + timedelta(days=7, hours=2)).replace(hour=0)
        else:
            labels.append(at.strftime("%Y-%m"))
            at = (at.replace(day=28) + timedelta(days=4)).replace(day=1)
    return starts, labels


def percentile(values: Sequence[float], fraction: float) -> Optional[float]:
    """The nearest-rank percentile (p90: `fraction` 0.9); None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[max(0, math.ceil(fraction * len(ordered)) - 1)]


def keyed(runs: Iterable[Run], by: str) -> Iterator[tuple[Any, ...]]:
    """Runs as `summarise` reads them: (job, name, GPU-seconds, queued, started, ended),
    the name the user's, group's, account's (`-` for none) or job's."""
    index = {"user": 1, "group": 2, "account": 3, "job": 0}[by]
    for run in runs:
        name = run[index]
        yield (run.job, "-" if name is None else name, *run[5:9])


def summarise(runs: Iterable[Sequence[Any]], per: str, since: float, until: float) -> list[Row]:
    """The report from (job, name, GPU-seconds, queued, started, ended) runs (`keyed`):
    one row per period and name with any use in the window, periods in order, names
    by GPU-hours (most first)."""
    starts, labels = boundaries(since, until, per)
    seconds: dict[tuple[int, str], float] = {}
    jobs: dict[tuple[int, str], set[Any]] = {}
    waits: dict[tuple[int, str], list[float]] = {}
    last = len(starts) - 1
    where = bisect.bisect_right
    for job, name, gpu_seconds, queued, started, ended in runs:
        low = started if started > since else since
        high = ended if ended < until else until
        first = where(starts, low) - 1 if last else 0
        if first < 0:
            first = 0
        if high > low and gpu_seconds > 0:
            rate = gpu_seconds / (ended - started)
            if first == last or high <= starts[first + 1]:  # within one period: most runs
                cell = (first, name)
                seconds[cell] = seconds.get(cell, 0.0) + (high - low) * rate
            else:
                for i in range(first, last + 1):
                    if starts[i] >= high:
                        break
                    begin = low if low > starts[i] else starts[i]
                    end = high if i == last or high < starts[i + 1] else starts[i + 1]
                    if end > begin:
                        cell = (i, name)
                        seconds[cell] = seconds.get(cell, 0.0) + (end - begin) * rate
        if since <= started < until:
            cell = (first, name)
            known = jobs.get(cell)
            if known is None:
                jobs[cell] = {job}
                waits[cell] = [started - queued if started > queued else 0.0]
                seconds.setdefault(cell, 0.0)
            else:
                known.add(job)
                waits[cell].append(started - queued if started > queued else 0.0)
    cells = sorted(seconds, key=lambda c: (c[0], -seconds[c], c[1]))
    out = []
    for cell in cells:
        waited = waits.get(cell, [])
        out.append(
            Row(
                labels[cell[0]],
                cell[1],
                seconds[cell] / 3600.0,
                len(jobs.get(cell, ())),
                len(waited),
                sum(waited) / len(waited) if waited else None,
                percentile(waited, 0.9),
            )
        )
    return out


def as_dicts(rows: Iterable[Row]) -> list[dict[str, Any]]:
    return [r._asdict() for r in rows]


def from_dicts(rows: Iterable[Mapping[str, Any]]) -> list[Row]:
    return [Row._make(r.get(c) for c in COLUMNS) for r in rows]


class Waste(NamedTuple):
    """GPU-hours a job held without using them: `report --waste`."""

    name: str  # the user, account or job
    held_hours: float  # GPU-hours held by the sampled runs
    idle_hours: float  # of which no sample saw the GPU busy
    gpus_idle: int  # GPUs that were never seen busy
    jobs: int


def waste(samples: Iterable[Sequence[Any]], by: str, min_idle_hours: float = 0.0) -> list[Waste]:
    """From (job, run, user, account, gpu, run seconds, sampled seconds, busy seconds)
    rows (service.accounting.use_between): the idle GPU-hours per `by` (user, account or
    job), most first. A GPU's idle share of its run is its sampled time not seen busy,
    over its sampled time: a run sampled for part of its life counts in proportion."""
    held: dict[str, float] = {}
    idle: dict[str, float] = {}
    never: dict[str, int] = {}
    jobs: dict[str, set[str]] = {}
    for job, _run, user, account, _gpu, length, sampled, busy in samples:
        name = {"user": user, "account": account or "-", "job": str(job)}.get(by, user)
        length = float(length or 0.0)
        sampled = float(sampled or 0.0)
        busy = float(busy or 0.0)
        share = max(0.0, sampled - busy) / sampled if sampled > 0 else 0.0
        held[name] = held.get(name, 0.0) + length / 3600.0
        idle[name] = idle.get(name, 0.0) + share * length / 3600.0
        never[name] = never.get(name, 0) + (1 if sampled > 0 and busy <= 0 else 0)
        jobs.setdefault(name, set()).add(str(job))
    rows = [
        Waste(n, held[n], idle[n], never[n], len(jobs[n]))
        for n in held
        if idle[n] >= min_idle_hours
    ]
    rows.sort(key=lambda w: (-w.idle_hours, w.name))
    return rows
