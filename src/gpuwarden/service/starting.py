"""Starts in flight: a job between its supervisor's go-ahead and the supervisor's report.

The service forks a job's supervisor, records it durably, publishes its lease naming the
supervisor, gives the go-ahead (service.spawn `begin`) and goes on: while the
supervisor makes the job's cgroup and marker and the job sets itself up as its owner
up to its `exec`, the loop starts other jobs, answers clients and reaps ends. The
report pipe is one more descriptor in the loop's selector; its end-of-file is the
event `arrived` takes: the job's pid (the lease renamed to it, the job RUNNING and
watched, its attached client told), or why it could not start (FAILED, said as a start
that failed at once is). A report that does not come within `spawn.REPORT_WITHIN`
fails the job as "did not answer in time" (`overdue`, on the loop's tick), and its
supervisor and what it started are killed: a job recorded FAILED never runs after.

Until its report the job is STARTING (the journal says so, and `queue` shows it): a
cancel is kept and its SIGTERM sent once the job runs (before its `exec` the job would
ignore it, as its supervisor does), a signal is refused, and preemption passes it by
(service.preempting takes jobs with a pid). A service stopped meanwhile lets go of the
pipe: the supervisor runs the job on and writes its marker with the job's pid, which
a restart adopts (service.recovery): RUNNING at once where the marker has the pid,
else once it has (read on the loop's tick).
"""

from __future__ import annotations

import contextlib
import logging
import os
import selectors
import signal
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Optional

from gpuwarden.base.errors import UserError
from gpuwarden.service import jobnotify, jobprocess, spawn, store

if TYPE_CHECKING:
    from typing import Protocol

    from gpuwarden.leases import Held
    from gpuwarden.service.attachment import Attachments
    from gpuwarden.service.notify import JobNotifier
    from gpuwarden.service.store import Job, Store

    class StartingService(Protocol):
        """What taking a start's report needs of the jobs' life (`joblife.JobLife`)."""

        starts: Starts
        selector: selectors.BaseSelector
        store: Store
        notifier: JobNotifier
        attachments: Attachments
        termed: dict[int, float]  # job id -> when SIGTERM was sent (or asked, while starting)
        watched: dict[int, int]  # job id -> pidfd of its supervisor
        processes: dict[int, int]  # job id -> pidfd of the job's first process
        exits: str  # where the exit records and markers are

        def watch_supervisor(
            self,
            job_id: int,
            pid: int,
            job_pid: Optional[int] = None,
            pidfd: int = -1,
            end: int = -1,
        ) -> None: ...

        def signal(self, job: Job, sig: int) -> bool: ...


log = logging.getLogger("gpuwarden.serve")


@dataclass
class Starting:
    """One start in flight: the job, its supervisor and report pipe, the lease the service
    keeps open to rename to the job's pid, the GPUs (as `started` names them), when it
    is overdue (monotonic), and the report as read so far."""

    job: int
    forked: spawn.Forked
    held: Held
    gpus: tuple[Any, ...]
    deadline: float
    chunks: list[bytes] = field(default_factory=list)


class Starts:
    """The starts in flight, by job id, and how many were ever in flight at once (`stats`:
    more than one means the loop went on while a job set itself up)."""

    def __init__(self) -> None:
        self.flight: dict[int, Starting] = {}
        # STARTING jobs a restart adopted before their supervisor wrote the job's pid to
        # its marker (service.recovery): the pid is read from there on the loop's tick.
        self.adopted: set[int] = set()
        self.begun = 0
        self.most = 0
        self.overdue = 0

    def before_exec(self, job_id: int) -> bool:
        """Whether `job_id` may still be setting itself up (no pid known yet)."""
        return job_id in self.flight or job_id in self.adopted

    def stats(self) -> dict[str, int]:
        return {
            "begun": self.begun,
            "in_flight": len(self.flight),
            "most_in_flight": self.most,
            "overdue": self.overdue,
        }


def begun(life: StartingService, start: Starting) -> None:
    """`start`'s supervisor has its go-ahead: its report is an event of the loop."""
    starts = life.starts
    starts.flight[start.job] = start
    starts.begun += 1
    starts.most = max(starts.most, len(starts.flight))
    os.set_blocking(start.forked.report, False)
    life.selector.register(start.forked.report, selectors.EVENT_READ, ("report", start.job))


def arrived(life: StartingService, job_id: int) -> None:
    """The report pipe of `job_id` is readable: keep what came; at the report's end (its
    line, or the pipe's end-of-file), settle. A job that runs keeps the pipe watched:
    its end-of-file is the job's end (service.spawn `Forked`)."""
    start = life.starts.flight.get(job_id)
    if start is None:
        return
    try:
        chunk = os.read(start.forked.report, 65536)
    except BlockingIOError:
        return
    if chunk:
        start.chunks.append(chunk)
        if b"\n" not in chunk:
            return
    _forget(life, start, keep=bool(chunk))
    forked = start.forked
    try:
        started = spawn.report_of(
            str(job_id), forked.supervisor, b"".join(start.chunks), pidfd=forked.pidfd
        )
    except UserError as err:
        _close(start)
        _let_go(forked)
        start.held.release()
        failed(life, job_id, err)
        return
    _running(life, start, started)


def overdue(life: StartingService, now: float) -> None:
    """Starts whose supervisor has not reported within `spawn.REPORT_WITHIN`: failed, as
    a start that waited for its report failed, their supervisor and what it started
    killed. Adopted starts whose job now runs (its pid in its marker): RUNNING."""
    for job_id in list(life.starts.adopted):
        _adopted(life, job_id)
    for start in [s for s in life.starts.flight.values() if now >= s.deadline]:
        _forget(life, start)
        life.starts.overdue += 1
        _stop(start.forked)
        _let_go(start.forked)
        start.held.release()
        failed(life, start.job, UserError("a job's supervisor did not answer in time"))


def close(life: StartingService) -> None:
    """The service stops: let go of the pipes and leases (the supervisors hold the leases
    and run their jobs on, for the next service to adopt)."""
    for start in list(life.starts.flight.values()):
        _forget(life, start)
        _let_go(start.forked)
        start.held.close()


def failed(life: StartingService, job_id: int, err: UserError) -> None:
    """A job that could not start: FAILED with the reason (said once), its owner's
    `--notify fail` told."""
    why = str(err)
    said = f"job {job_id} could not start: "
    why = why[len(said) :] if why.startswith(said) else why
    log.warning("job %s could not start: %s", job_id, why)
    life.store.update(job_id, state=store.FAILED, error=why, ended=time.time(), reason=None)
    job = life.store.get(job_id)
    if job is not None:
        jobnotify.send(life.notifier, job, ["FAIL"], state=store.FAILED, error=why)
    log.info("job %s ended: %s (it never started)", job_id, store.FAILED)


def _stop(forked: spawn.Forked) -> None:
    """A start given up: its supervisor and what it started are killed, so the job never
    runs once recorded FAILED, and the supervisor gone, so its leases go with it."""
    from gpuwarden.service.tree import signal_tree

    supervisor = forked.supervisor
    if supervisor <= 0:
        return
    if forked.pidfd >= 0:  # forked by the forker, which reaps it: named by its pidfd
        if not jobprocess.exited(forked.pidfd):  # so the pid is its own, not a reuse
            signal_tree(supervisor, signal.SIGKILL)
            with contextlib.suppress(ProcessLookupError):
                signal.pidfd_send_signal(forked.pidfd, signal.SIGKILL)
        jobprocess.exited(forked.pidfd, 2.0)
        return
    signal_tree(supervisor, signal.SIGKILL)
    with contextlib.suppress(ProcessLookupError):  # our child, not reaped: the pid is its own
        os.kill(supervisor, signal.SIGKILL)
    spawn.wait_supervisor(supervisor, timeout=2.0)


def _let_go(forked: spawn.Forked) -> None:
    if forked.pidfd >= 0:
        os.close(forked.pidfd)
        forked.pidfd = -1


def _adopted(life: StartingService, job_id: int) -> None:
    """A STARTING job a restart adopted: RUNNING once its marker names its pid (held by a
    pidfd to signal it by, as a job started here is); forgotten once it has ended."""
    job = life.store.get(job_id)
    if job is None or job.state != store.STARTING or job_id not in life.watched:
        life.starts.adopted.discard(job_id)
        return
    pid = (spawn.read_marker(life.exits, str(job_id)) or {}).get("pid")
    if not pid:
        return
    life.starts.adopted.discard(job_id)
    held = jobprocess.claim(pid, job.supervisor or 0)
    if held is not None:
        life.processes[job_id] = held
    life.store.later(job_id, state=store.RUNNING, pid=pid)  # the marker has it
    log.info("job %s runs (adopted while it started)", job_id)
    if job_id in life.termed:  # cancelled meanwhile
        running = life.store.get(job_id)
        if running is not None:
            life.signal(running, signal.SIGTERM)
        life.termed[job_id] = time.monotonic()


def _forget(life: StartingService, start: Starting, keep: bool = False) -> None:
    """`start` is no longer in flight; its report pipe closed (`keep`: left open, to
    watch for the job's end)."""
    life.starts.flight.pop(start.job, None)
    life.selector.unregister(start.forked.report)
    if not keep:
        _close(start)


def _close(start: Starting) -> None:
    if start.forked.report >= 0:
        os.close(start.forked.report)
        start.forked.report = -1


def _running(life: StartingService, start: Starting, started: spawn.Started) -> None:
    """The job has exec'd: its lease names it, it is RUNNING and watched, its client told;
    a cancel that came while it started is sent now."""
    from gpuwarden.jobs.holding import kill_group

    job_id = start.job
    try:
        start.held.repoint(started.pid)  # never a job under a lease naming another process
    except UserError as err:
        _close(start)
        kill_group(started.pid)
        _let_go(start.forked)
        start.held.release()
        failed(life, job_id, err)
        return
    start.held.close()  # its supervisor holds the leases; the service keeps no copy
    life.attachments.notify(job_id, {"event": "started", "gpus": [g.uuid for g in start.gpus]})
    life.attachments.release_stdio(job_id)  # the job has them now
    # Watched first: a journal that cannot take the pid now still learns of the end.
    pidfd, start.forked.pidfd = start.forked.pidfd, -1  # closed with it
    end, start.forked.report = start.forked.report, -1  # its end-of-file: the job's end
    life.watch_supervisor(job_id, started.supervisor, started.pid, pidfd, end)
    if job_id not in life.watched:  # its supervisor was gone already: ended there
        return
    # Written with the next commit, whoever makes it: a service killed meanwhile finds
    # the pid in the supervisor's marker (service.recovery).
    life.store.later(job_id, state=store.RUNNING, pid=started.pid)
    job = life.store.get(job_id)
    if job is None:
        return
    gpus = ",".join(str(g.index) for g in start.gpus)
    log.info("job %s started on GPUs %s for %s", job_id, gpus, job.user)
    if job_id in life.termed:  # cancelled while it set itself up
        life.signal(job, signal.SIGTERM)
        life.termed[job_id] = time.monotonic()  # its grace runs from the signal
    if jobnotify.wanted(job.request):
        jobnotify.send(life.notifier, job, ["BEGIN"])
