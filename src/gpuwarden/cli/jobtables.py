"""Tables of jobs and users, as `queue`, `jobs --history` and `share` print them, and
the job ids the queue commands read.

One shape for every source: a job is the dict the service's `queue`/`jobs`
operations answer with (docs/service.md), and rows from Slurm are mapped to the
same keys, so a user reads the same columns whichever ran their job.
"""

from __future__ import annotations

import time

from gpuwarden.base.table import render
from gpuwarden.base.units import format_size
from gpuwarden.files.safefiles import printable
from gpuwarden.jobs.options import job_ids as job_ids
from gpuwarden.queueclient import cells
from gpuwarden.queueclient.cells import span as span

TYPE_CHECKING = False  # typing stays off `submit`'s start-up (it reads job ids here)
if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence
    from typing import Any, Optional


def gpus_cell(job: Mapping[str, Any]) -> str:
    """How many GPUs a job holds and on which (nvidia-smi indices: "2@0,1", a MIG
    slice as "1@3(MIG)"), or how many it waits for ("(2)"): a count always comes
    first, so an index is never read as one."""
    return cells.gpus(
        job.get("gpus") or [], job.get("indices") or [], job.get("count"), job.get("mem")
    )


def cpu_cell(job: Mapping[str, Any]) -> str:
    """CPU time of all the job's processes (its cgroup's), `-` where not accounted."""
    cpu = job.get("cpu_seconds")
    return "-" if not isinstance(cpu, (int, float)) else span(cpu)


def mem_cell(job: Mapping[str, Any]) -> str:
    """The job's peak memory (its cgroup's: every process, page cache included)."""
    peak = job.get("mem_peak")
    return "-" if not isinstance(peak, int) else format_size(peak)


def command_cell(job: Mapping[str, Any]) -> str:
    words = job.get("command")
    if words is None:
        return "(hidden)"
    return printable(" ".join(str(w) for w in words))


def queue_table(jobs: Sequence[Mapping[str, Any]], now: Optional[float] = None) -> str:
    """Running jobs first, then waiting ones in priority order, as squeue lists them;
    a HOST column first when the jobs come from several hosts (`queue --hosts`)."""
    now = time.time() if now is None else now
    running = [j for j in jobs if j.get("state") in ("RUNNING", "STARTING")]
    waiting = sorted(
        (j for j in jobs if j.get("state") == "PENDING"),
        key=lambda j: (-(j.get("priority") or 0.0), j.get("submitted") or 0.0),
    )
    rows = []
    hosts = any("host" in job for job in jobs)
    for job in [*running, *waiting]:
        pending = job.get("state") == "PENDING"
        started = job.get("started")
        waited = (started if started else now) - (job.get("submitted") or now)
        estimate = job.get("estimated_start")
        note = runs_note(job)
        why = cells.reason(
            job.get("reason"),
            job.get("preemptible"),
            estimate - now if pending and estimate else None,
            note,
        )
        prio = job.get("priority")
        rows.append(
            [
                job_label(job),
                printable(str(job.get("user"))),
                str(job.get("state")),
                gpus_cell(job),
                why,
                "-" if prio is None or not pending else f"{prio:.0f}",
                span(waited),
                "-" if pending else span(job.get("elapsed")),
                span(job.get("time_limit")) if job.get("time_limit") else "-",
                "-" if pending else cpu_cell(job),
                "-" if pending else mem_cell(job),
                command_cell(job),
            ]
        )
        if hosts:
            rows[-1].insert(0, printable(str(job.get("host"))))
    if not rows:
        return "no jobs queued or running"
    headers = list(cells.HEADERS)
    right: tuple[int, ...] = cells.RIGHT
    headers, right = with_accounts(jobs, [*running, *waiting], headers, rows, right, 2 + hosts)
    if hosts:
        headers.insert(0, "HOST")
        right = tuple(i + 1 for i in right)
    return "\n".join(cells.lines(headers, rows, right))


def with_accounts(
    jobs: Sequence[Mapping[str, Any]],
    shown: Sequence[Mapping[str, Any]],
    headers: list[str],
    rows: list[list[str]],
    right: tuple[int, ...],
    after: int,
) -> tuple[list[str], tuple[int, ...]]:
    """An ACCOUNT column after the user's (column `after` of a row) when any job was
    charged to an account."""
    if not any(j.get("account") for j in jobs):
        return headers, right
    for row, job in zip(rows, shown):
        row.insert(after, printable(str(job.get("account") or "-")))
    headers.insert(2, "ACCOUNT")
    return headers, tuple(i + 1 if i >= 2 else i for i in right)


def unleased_lines(found: Sequence[Mapping[str, Any]], now: Optional[float] = None) -> list[str]:
    """The queue's header lines for GPU use outside any lease (no reservation, no job),
    one per GPU and user: it counts against that user's fair share like a job."""
    now = time.time() if now is None else now
    by: dict[tuple[str, str], list[Mapping[str, Any]]] = {}
    for row in found:
        index = row.get("index")
        key = ("?" if index is None else str(index), str(row.get("user") or "?"))
        by.setdefault(key, []).append(row)
    lines = []
    for (gpu, user), rows in sorted(by.items()):
        pids = ",".join(str(r.get("pid")) for r in rows)
        since = min(now if r.get("since") is None else r["since"] for r in rows)
        line = (
            f"unreserved: GPU {gpu} used by {printable(user)} (pid {pids}) for {span(now - since)}"
        )
        owners = sorted({str(r["leased_to"]) for r in rows if r.get("leased_to")})
        if owners:
            line += f", on a GPU leased to {printable(', '.join(owners))}"
        lines.append(line)
    return lines


def booking_rows(rows: Sequence[Mapping[str, Any]]) -> list[list[str]]:
    """Bookings as `book --list` lists them."""

    def when(stamp: Any) -> str:
        return time.strftime("%Y-%m-%d %H:%M", time.localtime(float(stamp)))

    return [
        [
            str(r.get("id")),
            str(r.get("count")),
            printable(str(r.get("user") or f"@{r.get('group')}")),
            when(r.get("start")),
            when(r.get("end")),
            printable(str(r.get("by"))),
            printable(str(r.get("reason"))),
        ]
        for r in rows
    ]


def booking_lines(
    rows: Sequence[Mapping[str, Any]], now: Optional[float] = None, hours: int = 24
) -> list[str]:
    """`queue`'s timeline of bookings: one line each over the next `hours` (a column per
    half hour, `#` while booked, `|` at the hour), then who, how many GPUs and when."""
    now = time.time() if now is None else now
    lines = []
    slots = hours * 2
    for r in rows:
        start, end = float(r.get("start") or 0), float(r.get("end") or 0)
        bar = "".join(
            "#" if start < now + (i + 1) * 1800 and now + i * 1800 < end else "."
            for i in range(slots)
        )
        whom = printable(str(r.get("user") or f"@{r.get('group')}"))
        when = time.strftime("%m-%d %H:%M", time.localtime(start))
        until = time.strftime("%m-%d %H:%M", time.localtime(end))
        state = "now" if start <= now else f"in {span(start - now)}"
        lines.append(
            f"booked [{bar}] {r.get('count')} GPUs for {whom}, {when} to {until} ({state}; "
            f"booking {r.get('id')}: {printable(str(r.get('reason')))})"
        )
    if lines:
        lines.insert(0, f"bookings, the next {hours} hours from now (one column per 30 minutes):")
    return lines


def runs_note(job: Mapping[str, Any]) -> str:
    """` (run 3, preempted 1x)` for a job queued again (requeued, retried, preempted)."""
    return cells.runs_note(job.get("restarts"), job.get("preemptions"))


def history_table(jobs: Sequence[Mapping[str, Any]]) -> str:
    """Ended jobs, newest first: how each ended and what it used. A job that ended
    without an exit status (it could not start, its supervisor died) says `error` in
    the table and the whole reason on a line below it, which a column would cut."""
    rows = []
    notes = []
    for job in jobs:
        elapsed = job.get("elapsed") or 0.0
        gpus = len(job.get("gpus") or []) or job.get("count") or 0  # Slurm's: a count
        gpu_hours = gpus * elapsed / 3600.0
        if job.get("runs"):  # every run of a requeued job (the service's journal)
            elapsed = job.get("run_seconds") or elapsed
            gpu_hours = (job.get("gpu_seconds") or 0.0) / 3600.0
        if job.get("signal"):
            how = f"signal {job['signal']}"
        elif job.get("exit_code") is not None:
            how = f"exit {job['exit_code']}"
        elif job.get("error"):
            how = "error"
            notes.append(printable(str(job["error"])))
        else:
            how = "-"
        how += runs_note(job)
        ended = job.get("ended")
        rows.append(
            [
                job_label(job),
                printable(str(job.get("user"))),
                str(job.get("state")),
                how,
                gpus_cell(job),
                span(elapsed),
                f"{gpu_hours:.2f}",
                cpu_cell(job),
                mem_cell(job),
                time.strftime("%m-%d %H:%M", time.localtime(ended)) if ended else "-",
                command_cell(job),
            ]
        )
    if not rows:
        return "no finished jobs"
    headers = [
        *("JOB", "USER", "STATE", "ENDED AS", "GPUS", "ELAPSED", "GPU-H", "CPU", "PEAKMEM"),
        *("ENDED", "COMMAND"),
    ]
    headers, right = with_accounts(jobs, jobs, headers, rows, (0, 5, 6, 7, 8), 2)
    return "\n".join([render(headers, rows, right=right), *notes])


def share_table(users: Sequence[Mapping[str, Any]], key: str = "user") -> str:
    """Each user's (or account's) decayed usage, share and fair-share factor, as sshare
    shows them."""
    rows = [
        [
            printable(str(u.get(key))),
            f"{(u.get('usage') or 0.0) / 3600.0:.2f}",  # as `jobs` gives GPU-hours
            f"{u.get('share', 1.0):g}",
            f"{u.get('factor', 1.0):.3f}",
        ]
        for u in sorted(users, key=lambda u: -(u.get("usage") or 0.0))
    ]
    if not rows:
        return "no usage recorded yet"
    return render([key.upper(), "GPU-HOURS", "SHARE", "FAIRSHARE"], rows, right=(1, 2, 3))


def job_names(words: list[str]) -> list[int | str]:
    """Job ids as `cancel`, `hold` and `unhold` read them: `12` (a job, or a whole
    array), `12_7` (task 7 of array 12), several as `12 13` or `12,13_4`."""
    from gpuwarden.planning.arrayspec import task_name

    names: list[int | str] = []
    for word in words:
        for part in word.split(","):
            part = part.strip()
            if task_name(part) is not None:
                names.append(part)
            else:
                names.extend(job_ids([part]))
    return names


def job_label(job: Mapping[str, Any]) -> str:
    """A job as squeue names it: `12`, a task `12_7`, an array's waiting tasks
    `12_[40-99%8]` (the service's `label`)."""
    return str(job.get("label") or job.get("id"))


def acted(
    command: str, verb: str, done: Sequence[object], refused: Sequence[Mapping[str, Any]]
) -> int:
    """The end of every command that acts on jobs by id (cancel, hold, unhold, requeue):
    `VERB: IDS` for the jobs done, one line on stderr for each refused; the exit status:
    0 all done, 1 some refused (the others were done), 2 none done."""
    import sys

    if done:
        print(f"{verb}: {', '.join(str(i) for i in done)}")
    for item in refused:
        print(f"gpuwarden {command}: {printable(str(item.get('error')))}", file=sys.stderr)
    if not done:
        return 2
    return 1 if refused else 0
