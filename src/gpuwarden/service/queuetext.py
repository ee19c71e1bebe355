"""`gpuwarden queue`'s table written by the service, from cells kept ready.

Decoding every row of a 10,000-job listing into a record and drawing the table
from the records made `queue --all` ten times `squeue`. The service answers the
table itself instead (a `queue` request with `table`): pages of finished lines,
which the client writes as they come.

What follows from a job alone (its label, user, account, state, limit, command,
how often it ran) is made into cells once per version of the job: the journal
(service.store) replaces a job's record on every change, so a record seen
before has the cells made then. A listing adds what moves with the clock and the
passes (priority, waited, elapsed, expected start, a running job's usage),
formats each row in one call (queueclient.cells, the client's own table for
Slurm and other hosts) and keeps the lines while the client pages through them
(`KEEP` seconds), so every page is cut from one table, aligned alike, each job
listed once.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple, Optional

from gpuwarden.files.safefiles import printable
from gpuwarden.queueclient import cells, protocol
from gpuwarden.service import arrays, listing, store
from gpuwarden.service.owners import mine

if TYPE_CHECKING:
    from gpuwarden.service.identity import Person
    from gpuwarden.service.joblife import JobLife

#: Seconds a listing's lines serve its first page again (another `queue` within it).
FRESH = 1.0
#: Seconds its lines serve the pages after the first.
KEEP = 30.0
#: Listings kept at once (different users and filters).
TABLES = 8


class Cells(NamedTuple):
    """What one version of a job shows, whatever the clock and the passes."""

    label: str
    user: str
    account: str
    limit: str
    command: str
    note: str  # runs_note
    why: str  # the reason it waits (or `preemptible`, `-`), its runs noted
    head: tuple[str, ...]  # a waiting job's first cells: label, user, state, GPUs
    tail: tuple[str, ...]  # and its last: elapsed, limit, CPU, peak memory, command
    hidden: tuple[str, ...]  # the same with its command hidden


class Table(NamedTuple):
    key: Any  # the listing's journal version and passes
    made: float  # time.monotonic()
    header: str
    lines: list[str]


class QueueText:
    """The cells of the jobs listed last, and the tables of the last listings."""

    def __init__(self) -> None:
        self.cells: dict[int, tuple[store.Job, Cells]] = {}
        self.tables: dict[Any, Table] = {}
        self.made = 0  # cells made (counted: tests)

    def _cells(self, job: store.Job, kept: dict[int, tuple[store.Job, Cells]]) -> Cells:
        known = self.cells.get(job.id)
        if known is not None and known[0] is job:
            kept[job.id] = known
            return known[1]
        self.made += 1
        limit = cells.span(job.time_limit) if job.time_limit else "-"
        command = printable(" ".join(listing.command(job.argv)))
        note = cells.runs_note(job.restarts, job.preemptions)
        label, user = arrays.label_of(job), printable(job.user)
        gpus = cells.gpus(job.gpus, [None] * len(job.gpus), job.count, job.mem)
        made = Cells(
            label,
            user,
            printable(job.account or "-"),
            limit,
            command,
            note,
            cells.reason(job.reason, job.preemptible, None, note),
            (label, user, job.state, gpus),
            ("-", limit, "-", "-", command),
            ("-", limit, "-", "-", "(hidden)"),
        )
        kept[job.id] = (job, made)
        return made

    def page(
        self,
        ask: protocol.Listing,
        viewer: tuple[Any, ...],
        key: Any,
        rows: Callable[[], Sequence[tuple[store.Job, Sequence[int]]]],
        shows: Callable[[store.Job], bool],
        now: Callable[[], Mapping[str, Any]],
    ) -> dict[str, Any]:
        """One page of the table for `ask`: `rows` the listing's rows in order (a job
        and the array tasks it stands for), `shows` whether the viewer sees a job's
        command, `now` what moves (`priorities`, `expected_start`, `indices`,
        `usage`); the table kept per `viewer` and filters while fresh."""
        which = (viewer, ask.user, ask.ids, ask.arrays)
        table = self.tables.get(which)
        if table is None or stale(table, key, ask.offset):
            whole = ask.user is None and not ask.ids  # every active job: the cells to keep
            table = self._table(key, rows(), shows, now(), whole)
            self.tables.pop(which, None)
            self.tables[which] = table
            while len(self.tables) > TABLES:
                del self.tables[next(iter(self.tables))]
        taken: list[str] = []
        size = 0
        for line in table.lines[ask.offset : ask.offset + ask.limit]:
            size += len(line) + 3 if line.isascii() else len(json.dumps(line)) + 1
            if taken and size > protocol.PAGE_BYTES:
                break
            taken.append(line)
        end = ask.offset + len(taken)
        total = len(table.lines)
        return {
            "ok": True,
            "header": table.header,
            "lines": taken,
            "total": total,
            "next": end if end < total else None,
        }

    def _table(
        self,
        key: Any,
        rows: Sequence[tuple[store.Job, Sequence[int]]],
        shows: Callable[[store.Job], bool],
        moving: Mapping[str, Any],
        whole: bool,
    ) -> Table:
        priorities: Mapping[int, float] = moving["priorities"]
        expected: Callable[[int], Optional[float]] = moving["expected_start"]
        indices: Mapping[str, int] = moving["indices"]
        usage: Callable[[int], tuple[Optional[float], Optional[int]]] = moving["usage"]
        clock = time.time()
        kept: dict[int, tuple[store.Job, Cells]] = {}
        accounts = False  # an ACCOUNT column when any job was charged to one
        spans: dict[int, str] = {}  # WAITED by whole seconds: one span a distinct wait
        numbers: dict[Optional[float], str] = {None: "-"}  # PRIORITY likewise
        out: list[tuple[str, ...]] = []
        for job, tasks in rows:
            made = self._cells(job, kept)
            if job.state != store.PENDING:
                label = arrays.row_fields(job, tasks)["label"] if tasks else made.label
                command = made.command if shows(job) else "(hidden)"
                row = self._running(job, made, label, command, clock, indices, usage)
            else:  # thousands of these: cells kept, a few lookups each
                start = expected(job.id)
                why = made.why
                if start:
                    why = cells.reason(job.reason, job.preemptible, start - clock, made.note)
                prio = priorities.get(job.id)
                number = numbers.get(prio)
                if number is None:
                    number = numbers[prio] = f"{prio:.0f}"
                waited = round((job.started or clock) - job.submitted)  # a requeued job's run
                span = spans.get(waited)
                if span is None:
                    span = spans[waited] = cells.span(waited)
                head = made.head
                if tasks:
                    head = (arrays.row_fields(job, tasks)["label"], *head[1:])
                row = head + (why, number, span) + (made.tail if shows(job) else made.hidden)
            if job.account:
                accounts = True
            out.append(row)
        if accounts:
            at = cells.ACCOUNT
            out = [
                (*row[:at], kept[job.id][1].account, *row[at:]) for row, (job, _) in zip(out, rows)
            ]
        if whole:
            self.cells = kept  # the ended jobs' cells go
        else:
            self.cells.update(kept)  # one user's listing keeps the others' cells
        headers = list(cells.HEADERS)
        right: tuple[int, ...] = cells.RIGHT
        if accounts:
            headers.insert(cells.ACCOUNT, "ACCOUNT")
            right = tuple(i + 1 if i >= cells.ACCOUNT else i for i in right)
        lines = cells.lines(headers, out, right)
        return Table(key, time.monotonic(), lines[0], lines[1:])

    @staticmethod
    def _running(
        job: store.Job,
        made: Cells,
        label: str,
        command: str,
        clock: float,
        indices: Mapping[str, int],
        usage: Callable[[int], tuple[Optional[float], Optional[int]]],
    ) -> tuple[str, ...]:
        """A row of a job that holds GPUs (a few: as many as the machine has)."""
        from gpuwarden.base.units import format_size

        cpu, peak = job.cpu_seconds, job.mem_peak
        if job.state == store.RUNNING:
            cpu, peak = usage(job.id)
        started = job.started
        return (
            label,
            made.user,
            job.state,
            cells.gpus(job.gpus, [indices.get(u) for u in job.gpus], job.count, job.mem),
            cells.reason(job.reason, job.preemptible, None, made.note),
            "-",
            cells.span((started or clock) - job.submitted),
            cells.span(None if started is None else (job.ended or clock) - started),
            made.limit,
            "-" if not isinstance(cpu, (int, float)) else cells.span(cpu),
            "-" if not isinstance(peak, int) else format_size(peak),
            command,
        )


def stale(table: Table, key: Any, offset: int) -> bool:
    """Whether `table` is too old for a page at `offset`: a first page wants one made
    within FRESH from the journal as it is; later pages the table the first was cut
    from, within KEEP."""
    age = time.monotonic() - table.made
    if offset == 0:
        return table.key != key or age > FRESH
    return age > KEEP


def answer(
    text: QueueText,
    life: JobLife,
    who: Person,
    ask: protocol.Listing,
    key: Any,
    ordered: Sequence[store.Job],
) -> dict[str, Any]:
    """A page of `queue`'s table for `who` from `life` (service.joblife): commands
    shown as `jobs` shows them (the owner's, or everyone's to an admin or where the
    config says so)."""
    show = life.settings.show_commands or life.settings.admins.include(who)

    def rows() -> Sequence[tuple[store.Job, Sequence[int]]]:
        return arrays.grouped(ordered) if ask.arrays else [(job, ()) for job in ordered]

    def moving() -> Mapping[str, Any]:
        from gpuwarden.service.reports import usage_now

        queue = life.queue
        return {
            "priorities": queue.priorities,
            "expected_start": queue.expected_start,
            "indices": queue.indices,
            "usage": lambda job_id: usage_now(life, job_id),
        }

    viewer = (who.uid, who.name, show)
    return text.page(ask, viewer, key, rows, lambda job: show or mine(job, who), moving)
