"""A job's life in the service: started, watched, ended, recovered after a crash.

`JobLife` owns what the queue knows of its jobs between two turns of the loop: the
journal (service.store, whose job states move only by service.states' table), what
the last pass of the plan worked out (`queue`, service.queuestate: written by the
pass alone, service.passes), the pidfd of each running job's supervisor (readable
when it ends, also for supervisors adopted after a restart: `recover`), the ends the
journal could not take yet (service.unwritten), and the jobs signalled for their time
or preempted. It is given its collaborators: the settings in force (a reload replaces
them), the machine, the notifier, the pacer, the selector the loop waits on, and the
attached jobs' clients (service.attachment, the socket loop's).

Time limits and cancels are SIGTERM, then SIGKILL after the grace period, sent to every
process in the job's cgroup (service.jobcgroup) so that none escapes by leaving its
process group, and the cgroup's CPU and peak memory are recorded when the job ends.
Functions of other modules act on it through the protocol each names (service.timelimits,
service.preempting, service.requeue, service.unwritten, service.placing).
"""

from __future__ import annotations

import logging
import os
import selectors
import signal
import time
from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING, Any, Optional

from gpuwarden.base.errors import UserError
from gpuwarden.planning import scheduling
from gpuwarden.service import (
    attachment,
    exitrecord,
    jobnotify,
    jobprocess,
    litter,
    preempting,
    requeue,
    spawn,
    starting,
    store,
    unwritten,
)
from gpuwarden.service.forker import Forker
from gpuwarden.service.liveconfig import LiveConfig
from gpuwarden.service.queuestate import QueueState

if TYPE_CHECKING:
    from gpuwarden import config
    from gpuwarden.machine.inventory import Snapshot
    from gpuwarden.service.attachment import Attachments
    from gpuwarden.service.bookings import Bookings
    from gpuwarden.service.machine import Machine
    from gpuwarden.service.notify import JobNotifier
    from gpuwarden.service.pacing import Pacer
    from gpuwarden.service.sampler import Sampler
    from gpuwarden.service.settings import Settings
    from gpuwarden.service.watching import ServiceWatch

log = logging.getLogger("gpuwarden.serve")

SIGTERM = int(signal.SIGTERM)  # a default below, where `signal` names a method


def exits_folder(state_dir: str) -> str:
    """Where the jobs' exit records and markers are (service.spawn)."""
    return os.path.join(state_dir, "jobs")


class JobLife:
    """The queue's jobs: their journal, their supervisors, their ends."""

    def __init__(
        self,
        settings: Settings,
        hardware: Machine,
        notifier: JobNotifier,
        pacer: Pacer,
        journal: store.Store,
        attachments: Attachments,
        selector: selectors.BaseSelector,
    ) -> None:
        self.settings = settings  # replaced by a reload (service.reloading)
        self.hardware = hardware  # the GPUs as planned on, read as decisions need them
        self.read_snapshot: Callable[[], Snapshot] = hardware.read  # the whole machine, now
        self.notifier = notifier
        self.pacer = pacer  # when to plan next: at once, or coalesced (service.pacing)
        self.store = journal
        self.attachments = attachments  # the attached jobs' clients (service.clients)
        self.selector = selector  # the loop's: a supervisor's pidfd is readable at its end
        self.exits = exits_folder(settings.state_dir)  # exit records and markers
        self.watched: dict[int, int] = {}  # job id -> pidfd of its supervisor (or job)
        # job id -> its supervisor's report pipe, whose end-of-file is the job's end
        # (service.spawn `Forked`): watched in place of the pidfd where there is one
        self.ends: dict[int, int] = {}
        self.processes: dict[int, int] = {}  # job id -> pidfd of the job's first process
        self.starts = starting.Starts()  # supervisors given the go-ahead, not yet reported
        self.forker = Forker(self.exits)  # forks the supervisors: the service never forks
        self.litter: list[str] = []  # files of ended jobs, removed in batches (litter.due)
        self.litter_batches = 0
        # What an end leaves that no start waits for (its notices, its cgroup's removal),
        # done once the turn's go-aheads are given (`settle`).
        self.afterwards: list[Callable[[], None]] = []
        self.stocked = -1  # `starts.begun` when lease records were last made ahead
        # job id -> its end (or cancel) the journal could not take yet (service.unwritten)
        self.unwritten: dict[int, Callable[[], None]] = {}
        self.termed: dict[int, float] = {}  # job id -> when SIGTERM was sent for its time
        self.preempting: dict[int, float] = {}  # job id -> when its preemption signal went
        self.preempted: dict[str, int] = {}  # preemptions since the start, by the victim's owner
        self.next_tick = 0.0  # monotonic time of the next time-limit round (the loop's tick)
        self.swept = 0.0  # when the cgroups of ended jobs were last looked for
        self.digested = 0.0  # when due digests were last looked for (service.digests)
        self.archived_at = 0.0  # when history is next looked at for archiving (archive)
        # What the last pass of the plan worked out, read between passes (one writer).
        self.queue = QueueState()
        self.machine: Optional[Snapshot] = None  # the machine read at start (admission)
        # The configuration as last read: at start, then by each pass that plans. What
        # changes without a reload (where drains and XID logs are, the health rules) is
        # taken from it and handed down; a submit is judged by it (service.admission).
        self.reading: Optional[config.Config] = None
        self.live = LiveConfig()  # that reading, read again only when its files change
        self.cgroup_mode: Optional[str] = None  # the machine's cgroup hierarchy, found once
        self.watch: Optional[ServiceWatch] = None  # the enforcement watch, made on first need
        self.sampler: Optional[Sampler] = None  # the running jobs' GPUs for `eff`, likewise
        # (user, account) -> GPU-seconds of ended runs, read once, then added to (`ran`)
        self.usage_totals: Optional[dict[tuple[str, str], float]] = None
        self._bookings: Optional[Bookings] = None

    def bookings(self) -> Bookings:
        """GPUs booked ahead (service.bookings): read from the journal on first need."""
        if self._bookings is None:
            from gpuwarden.service.bookings import Bookings

            self._bookings = Bookings(self.store)
        return self._bookings

    def close(self) -> None:
        """Let go of the supervisors' pidfds and report pipes: the jobs run on, for the
        next service."""
        starting.close(self)
        self.forker.close()
        for fd in [*self.watched.values(), *self.processes.values(), *self.ends.values()]:
            os.close(fd)
        self.watched.clear()
        self.processes.clear()
        self.ends.clear()

    def client_left(self, job_id: int) -> None:
        """An attached client went away (its terminal closed, it was killed): its job
        ends too, as a job started from a shell would."""
        job = self.store.get(job_id)
        if job is None or job.state not in store.ACTIVE:
            return
        log.info("job %s: its attached client left; cancelling it", job_id)
        self.cancel(job)

    # -- the job's cgroup: signals, usage, removal -----------------------------------------

    def job_cgroup(self, job_id: int) -> dict[str, str]:
        """The job's cgroup directories ({} where the machine or the job has none)."""
        mode = self.cgroup_mode
        if mode is None:
            from gpuwarden.cgroups.hierarchy import detect

            mode = self.cgroup_mode = detect()[0]
        if mode == "none" or self.settings.devices == "off":
            return {}
        from gpuwarden.service.jobcgroup import kept_place, placed_dirs

        return placed_dirs(kept_place(self.exits), str(job_id))  # where its start made them

    def signal(self, job: store.Job, sig: int) -> bool:
        """`sig` once to every process of the job: its cgroup's (however they detached),
        else, while its supervisor runs, every process below it (service.tree: what
        detached was re-parented there), else its process group's while its first
        process lives. Once: a job that takes a second SIGTERM for "abort now" would
        lose its checkpoint. Never to a stored pid number (service.jobprocess,
        service.tree). False: nothing of the job was there to signal."""
        dirs = self.job_cgroup(job.id)
        if dirs:
            from gpuwarden.cgroups.accounting import signal_dirs

            if signal_dirs(dirs, sig):
                return True
        elif job.supervisor and self._supervising(job.id):
            from gpuwarden.service.tree import signal_tree

            if signal_tree(job.supervisor, sig):
                return True
        pidfd = self.processes.get(job.id)
        if pidfd is not None and job.pid:
            return jobprocess.signal_group(pidfd, job.pid, sig)
        return False

    def _supervising(self, job_id: int) -> bool:
        """Whether the job's supervisor still runs: its pidfd (taken at start or adoption)
        is not readable yet, so the pid still names it, not a process that reused it."""
        import select

        fd = self.watched.get(job_id)
        return fd is not None and not select.select([fd], [], [], 0)[0]

    def close_cgroup(self, job_id: int, dirs: dict[str, str], later: bool = False) -> None:
        """An ended job's leftover processes go with it (as Slurm ends a job's step), then
        its cgroup; one that is not empty yet is removed by a later `sweep_cgroups`.
        `later`: an empty one is removed once the turn's go-aheads are given (`settle`):
        nothing left in it holds a lock the next start needs."""
        from gpuwarden.cgroups.accounting import pids_in, signal_dirs

        where = dirs.get("devices", dirs.get(""))
        if where and signal_dirs(dirs, signal.SIGKILL):
            deadline = time.monotonic() + 2.0  # killed processes leave within milliseconds
            while pids_in(where) and time.monotonic() < deadline:
                time.sleep(0.01)
        elif later:
            self.afterwards.append(partial(self._remove_cgroup, job_id, dirs))
            return
        self._remove_cgroup(job_id, dirs)

    @staticmethod
    def _remove_cgroup(job_id: int, dirs: dict[str, str]) -> None:
        from gpuwarden.service.jobcgroup import remove_job

        if not remove_job(dirs):
            log.info("job %s: its cgroup is not empty yet; removed later", job_id)

    def settle(self, stock: bool = True) -> None:
        """What the ends of the turn left that no start waits for (their notices, their
        cgroups' removal), and the next starts' lease record files, after the turn's
        go-aheads: a freed GPU's next job does not wait for them (no files made ahead
        without `stock`: the service stops). A piece that fails is dropped; the rest
        waits for the next turn."""
        while self.afterwards:
            self.afterwards.pop(0)()
        spares, gpus = self.hardware.spares, len(self.machine.gpus) if self.machine else 0
        # The next starts' lease records, made now (leases.spares): after a start took
        # some, not again every turn where they cannot be (a refused directory, a full disk).
        if stock and spares.short(gpus) and self.stocked != self.starts.begun:
            self.stocked = self.starts.begun
            try:
                spares.stock(self.hardware.lease_dirs.open(self.settings.lease_dir), gpus)
            except (OSError, UserError) as err:
                log.debug("lease records not made ahead: %s", err)

    def watcher(self) -> ServiceWatch:
        if self.watch is None:
            from gpuwarden.service.watching import ServiceWatch

            self.watch = ServiceWatch(self)
        return self.watch

    def sweep_cgroups(self) -> None:
        """Remove the cgroups of jobs no longer running (ended while the service was down,
        or not empty when they ended), with whatever is left in them."""
        if self.settings.devices == "off" or self.cgroup_mode == "none":
            return
        from gpuwarden.service.jobcgroup import scope_of, service_jobs

        active = {str(j.id) for j in self.store.jobs([store.STARTING, store.RUNNING])}
        for job_id, dirs in service_jobs(scope_of(self.exits)).items():
            if job_id not in active:
                self.close_cgroup(int(job_id), dirs)

    def requeue_unstarted(self, job: store.Job) -> None:
        log.warning("job %s never started before a restart; queued again", job.id)
        from gpuwarden.service.placing import release_leases

        release_leases(self, job)
        self.store.update(
            job.id, state=store.PENDING, gpus=(), started=None, supervisor=None, pid=None
        )

    def cancel(self, job: store.Job, sig: int = SIGTERM) -> None:
        """End `job`: a waiting one at once (its attached client exits 128+`sig`, as a
        shell's command would for the Ctrl-C that cancelled it), a running or starting
        one by SIGTERM, then SIGKILL after the grace period."""
        if job.id in self.unwritten:
            return  # it has ended: its end waits for the journal's disk (service.unwritten)
        if job.state == store.PENDING:
            end = partial(self.store.update, job.id, state=store.CANCELLED, ended=time.time())
            unwritten.write(self, job.id, partial(end, reason=None))  # a full disk: kept
            self.ended_attached(job.id, None, sig=sig)
            ended = jobnotify.matched(jobnotify.EVENTS, store.CANCELLED)
            jobnotify.send(self.notifier, job, ended, state=store.CANCELLED, elapsed=0.0)
        elif job.pid or job.state == store.STARTING:
            # Once: a second SIGTERM may abort its checkpoint. A job still setting itself
            # up gets it when it has exec'd (service.starting): it would ignore it now.
            if job.id not in self.termed and not self.starts.before_exec(job.id):
                self.signal(job, signal.SIGTERM)
            self.termed.setdefault(job.id, time.monotonic())
            unwritten.note(self, job.id, partial(self.store.update, job.id, reason="cancelling"))

    def refuse(self, job: store.Job, reason: str) -> None:
        """A job that must start now or not at all (`run` without --wait) that cannot."""
        why = f"no GPU fits now ({reason}); add --wait to queue for one"
        self.store.update(job.id, state=store.CANCELLED, ended=time.time(), error=why, reason=None)
        self.attachments.notify(job.id, {"event": "ended", "status": 75, "error": why})
        self.ended_attached(job.id, None, quiet=True)

    def ended_attached(
        self,
        job_id: int,
        ended: Optional[exitrecord.Ended],
        quiet: bool = False,
        sig: int = SIGTERM,
    ) -> None:
        """Tell an attached client how its job ended, and let go of its descriptors."""
        if not quiet:
            status = 128 + sig if ended is None else ended.shell_status
            error = "cancelled before it started" if ended is None else ended.error
            self.attachments.notify(job_id, {"event": "ended", "status": status, "error": error})
        self.attachments.ended(job_id)
        if ended is None:  # ended before it started: no exit record to remove later
            attachment.forget_client(self.exits, str(job_id))

    def watch_supervisor(
        self, job_id: int, pid: int, job_pid: Optional[int] = None, pidfd: int = -1, end: int = -1
    ) -> None:
        """Watch the job's supervisor `pid` (through `pidfd`, taken here when not given:
        the forker's child, it may be reaped and its number reused) for the job's end
        (its report pipe `end`'s end-of-file where there is one, else the supervisor's
        exit), and hold a pidfd of the job's own first process `job_pid` to signal it
        by (service.jobprocess)."""
        if end >= 0:
            self.ends[job_id] = end
        try:
            fd = pidfd if pidfd >= 0 else os.pidfd_open(pid)
        except ProcessLookupError:
            self.ended(job_id)
            return
        if job_pid:
            held = jobprocess.claim(job_pid, pid)
            if held is not None:
                self.processes[job_id] = held
        self.watched[job_id] = fd
        self.selector.register(end if end >= 0 else fd, selectors.EVENT_READ, ("job", job_id))

    def ended(self, job_id: int) -> None:
        end = self.ends.pop(job_id, None)
        fd = self.watched.pop(job_id, None)
        for watched in (end, fd):  # the pidfd is not watched where the pipe is
            if watched is not None:
                if watched in self.selector.get_map():
                    self.selector.unregister(watched)
                os.close(watched)
        held = self.processes.pop(job_id, None)
        if held is not None:
            os.close(held)
        job = self.store.get(job_id)
        if job is not None and job.supervisor:
            self.forker.ended(job.supervisor)  # it may take another job from now on
        if job is None or job.state not in (store.STARTING, store.RUNNING):
            return
        self.hardware.freed(job.gpus)  # its processes leave the reading (service.machine)
        if job.supervisor:
            spawn.wait_supervisor(job.supervisor, timeout=0)
        ended = exitrecord.read_exit_record(self.exits, str(job_id))
        if ended is not None:
            self.finish(job, ended)
        elif spawn.read_marker(self.exits, str(job_id)) is None:
            self.requeue_unstarted(job)  # its supervisor never had the go-ahead
        else:
            self.finish(
                job, exitrecord.Ended(None, None, "its supervisor died", time.time()), store.LOST
            )

    def finish(self, job: store.Job, ended: exitrecord.Ended, state: Optional[str] = None) -> None:
        charge = preempting.charge(self.settings, job)
        preempted = preempting.ended(self, job)
        if state is None and (requeue.asked(job) or preempted == "requeue"):
            # Waits again under its id (a preempted submitit call asks for it too).
            requeue.again(self, job, ended, preempted=bool(preempted), charge=charge)
            return
        if state is None:
            if preempted:
                state = store.PREEMPTED
            elif job.id in self.termed and job.reason == "time limit":
                state = store.TIMEOUT
            elif job.id in self.termed:
                state = store.CANCELLED
            elif ended.ok:
                state = store.COMPLETED
            elif requeue.retrying(job):
                requeue.again(self, job, ended, retry=True, charge=charge)
                return
            else:
                state = store.FAILED
        now = time.time()
        started = job.started or now
        from gpuwarden.service.placing import release_leases

        dirs = self.job_cgroup(job.id)
        used: dict[str, Any] = {}
        if dirs:
            from gpuwarden.cgroups.accounting import usage_of

            used = usage_of(dirs)
            # Its leftovers killed before the leases (they hold their locks); the empty
            # cgroup removed after the turn's go-aheads.
            self.close_cgroup(job.id, dirs, later=True)
        release_leases(self, job)
        cpu = used.get("cpu_ns")
        memory = self.queue.gpu_memory(job.gpus)
        used_gpu = scheduling.job_usage(len(job.gpus), (ended.at or now) - started, job.mem, memory)
        final = state

        def record() -> None:
            # The end and the usage it adds: one commit, made durable by the next job's
            # start or by `remove_litter`, whichever comes first (see Store.sync); until
            # then the exit record on disk says how the job ended.
            with self.store.transaction(durable=False):
                self.store.update(
                    job.id,
                    cpu_seconds=None if cpu is None else cpu / 1e9,
                    mem_peak=used.get("memory_peak"),
                    state=final,
                    ended=ended.at or now,
                    exit_code=ended.code,
                    exit_signal=ended.signal,
                    error=ended.error,
                    reason=None,
                )
                self.store.charge(job.user, charge * used_gpu, now, self.settings.policy.half_life)
                self.ran(job, ended.at or now, final, used_gpu)  # its GPU-hours held, uncharged
            # Removed in a batch when no job waits, not on the way from a freed GPU to
            # the next start (`remove_litter`); only once the end is written (service.litter).
            self.litter.extend(litter.of_job(self.exits, job.id))

        unwritten.write(self, job.id, record)  # a full disk: kept, written when it has room
        self.termed.pop(job.id, None)
        self.ended_attached(job.id, ended)
        self.afterwards.append(partial(self._told, job, ended, state, (ended.at or now) - started))
        self.pacer.wake()

    def _told(self, job: store.Job, ended: exitrecord.Ended, state: str, elapsed: float) -> None:
        """The notices of `job`'s end: its own webhook's, and the service's webhook or
        mail where one is configured (the notifier's helper drops them otherwise)."""
        kinds = jobnotify.matched(jobnotify.EVENTS, state)
        jobnotify.send(
            self.notifier,
            job,
            kinds,
            state=state,
            exit_code=ended.code,
            signal=ended.signal,
            elapsed=elapsed,
        )
        if self.notifier.enabled:
            self.notifier.notify(
                {
                    "event": "job_ended",
                    "job": job.id,
                    "user": job.user,
                    "state": state,
                    "exit_code": ended.code,
                    "signal": ended.signal,
                    "error": ended.error,
                    "command": list(job.argv),
                    "gpus": list(job.gpus),
                    "output": job.output,
                    "elapsed": elapsed,
                    "host": os.uname().nodename,
                }
            )
        log.info("job %s ended: %s", job.id, state)

    def ran(self, job: store.Job, ended: float, state: str, gpu_seconds: float) -> None:
        """A run of `job` ended: kept for `report` (service.accounting), with what the
        sampler saw of its GPUs for `eff`; inside the caller's commit."""
        from gpuwarden.service import accounting

        run = accounting.record_run(self.store.db, job, ended, state, gpu_seconds)
        charged = gpu_seconds * preempting.charge(self.settings, job)  # as the user's
        policy = self.settings.policy
        if job.account or policy.account_shares:  # no account's (`-`): for the account level
            self.store.charge_account(job.account, job.user, charged, ended, policy.half_life)
        if self.sampler is not None:
            accounting.save_use(self.store.db, job.id, run, self.sampler.take(job.id))
        if self.usage_totals is not None:  # last: a failed write above adds nothing
            key = (job.user, job.account or "")
            self.usage_totals[key] = self.usage_totals.get(key, 0.0) + max(0.0, gpu_seconds)

    def remove_litter(self, most: Optional[int] = None) -> None:
        """Remove the exit records and markers of jobs whose end is committed (the
        `most` oldest of them; None: all), once that commit is on disk: until then a
        power cut would leave the journal without the end and the disk without the
        record of it."""
        if self.litter:
            self.store.sync()
            self.litter_batches += 1
        going = self.litter if most is None else self.litter[:most]
        litter.remove(going)
        del self.litter[: len(going)]
