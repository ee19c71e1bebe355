"""A job's life in the service: planned, started, watched, ended, recovered after a crash.

`schedule()` asks `scheduling.plan` what starts and starts it (service.placing);
a pidfd per supervisor tells when a job ended, also for supervisors adopted after
a restart (`recover`); time limits and cancels are SIGTERM, then SIGKILL after the
grace period, sent to every process in the job's cgroup (service.jobcgroup) so that
none escapes by leaving its process group, and the cgroup's CPU and peak memory are
recorded when the job ends. Over the state of service.core.
"""

from __future__ import annotations

import logging
import os
import selectors
import signal
import time
from functools import partial
from typing import TYPE_CHECKING, Any, Optional

from gpuwarden import config
from gpuwarden.base.errors import UserError
from gpuwarden.planning import preemption, scheduling
from gpuwarden.service import (
    arrays,
    attachment,
    bookings,
    jobnotify,
    jobprocess,
    limiting,
    litter,
    preempting,
    requeue,
    spawn,
    store,
    unwritten,
)
from gpuwarden.service.core import Core

if TYPE_CHECKING:
    from gpuwarden.service.watching import ServiceWatch

log = logging.getLogger("gpuwarden.serve")

SIGTERM = int(signal.SIGTERM)  # a default below, where `signal` names a method


class Lifecycle(Core):
    def recover(self) -> None:
        """Find every job of the journal again after a start, a crash or a `kill -9`.

        A STARTING job whose supervisor was never recorded never got the go-ahead: its
        supervisor (if one was forked) exits without running it, so it is queued again.
        A recorded supervisor still alive is watched; when it ends, its exit record
        says how the job ended, and its absence with no marker means it never started.
        """
        for job in self.store.jobs([store.STARTING, store.RUNNING]):
            marker = spawn.read_marker(self.exits, str(job.id))
            ended = spawn.read_exit_record(self.exits, str(job.id))
            if ended is not None:
                self._finish(job, ended)
            elif (
                job.supervisor
                and spawn.start_time(job.supervisor) >= 0
                and (marker is None or spawn.alive(marker["supervisor"], marker.get("since", -1)))
            ):
                pid = (marker or {}).get("pid") or job.pid
                unwritten.note(self, job.id, partial(self.store.update, job.id, pid=pid))
                self._watch(job.id, job.supervisor, pid)
                if job.reason in ("time limit", "cancelling", requeue.ASKED):  # not again
                    self.termed[job.id] = time.monotonic()
                elif job.reason == preempting.REASON:  # its signal went: SIGKILL after grace
                    self.preempting[job.id] = time.monotonic()
                log.info("re-adopted job %s", job.id)
            elif marker is None:
                self._requeue(job)
            else:
                self._finish(
                    job, spawn.Ended(None, None, "its supervisor died", time.time()), store.LOST
                )
        for job in self.store.jobs(store.ACTIVE):
            if not job.attached:
                continue
            # Its client reconnects (`attach`) unless it died meanwhile, or never learnt
            # the job's number (a submit recorded, its answer not sent: not started).
            client = attachment.read_client(self.exits, str(job.id))
            if client is None and job.state == store.PENDING:
                self.store.update(
                    job.id,
                    state=store.CANCELLED,
                    ended=time.time(),
                    error="the service restarted before it answered the submit",
                )
                continue
            client = client or attachment.ClientProcess(0, -1)
            self.attachments.orphans[job.id] = (
                time.monotonic() + attachment.REATTACH_WITHIN,
                client,
            )
        self.sweep_cgroups()
        self._litter_of_ended_jobs()
        self.pacer.wake()

    def _end_orphans(self) -> None:
        """Attached jobs whose client has not come back after a restart: ended once the
        client is known dead, or after `REATTACH_WITHIN` (its client gave up before)."""
        for job_id, why in attachment.gone(
            self.attachments.orphans, self.attachments.attached, time.monotonic()
        ):
            job = self.store.get(job_id)
            if job is not None and job.state in store.ACTIVE:
                log.info("job %s: its attached client %s after a restart; cancelling", job_id, why)
                self._cancel(job)

    def _litter_of_ended_jobs(self) -> None:
        """Exit records and markers of jobs the journal has ended (a service killed
        before `remove_litter` leaves them): removed."""
        self.litter.extend(litter.left_by_ended(self.exits, (j.id for j in self.store.jobs())))
        self.remove_litter()

    # -- the job's cgroup: signals, usage, removal -----------------------------------------

    def job_cgroup(self, job_id: int) -> dict[str, str]:
        """The job's cgroup directories ({} where the machine or the job has none)."""
        mode = self.cgroup_mode
        if mode is None:
            from gpuwarden.cgroups.hierarchy import detect

            mode = self.cgroup_mode = detect()[0]
        if mode == "none" or self.settings.devices == "off":
            return {}
        from gpuwarden.service.jobcgroup import job_dirs, scope_of

        return job_dirs(scope_of(self.exits), str(job_id), mode)

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

    def _close_cgroup(self, job_id: int, dirs: dict[str, str]) -> None:
        """An ended job's leftover processes go with it (as Slurm ends a job's step), then
        its cgroup; one that is not empty yet is removed by a later `sweep_cgroups`."""
        from gpuwarden.cgroups.accounting import pids_in, signal_dirs
        from gpuwarden.service.jobcgroup import remove_job

        where = dirs.get("devices", dirs.get(""))
        if where and signal_dirs(dirs, signal.SIGKILL):
            deadline = time.monotonic() + 2.0  # killed processes leave within milliseconds
            while pids_in(where) and time.monotonic() < deadline:
                time.sleep(0.01)
        if not remove_job(dirs):
            log.info("job %s: its cgroup is not empty yet; removed later", job_id)

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
                self._close_cgroup(int(job_id), dirs)

    def _requeue(self, job: store.Job) -> None:
        log.warning("job %s never started before a restart; queued again", job.id)
        from gpuwarden.service.placing import release_leases

        release_leases(self, job)
        self.store.update(
            job.id, state=store.PENDING, gpus=(), started=None, supervisor=None, pid=None
        )

    def _cancel(self, job: store.Job, sig: int = SIGTERM) -> None:
        """End `job`: a waiting one at once (its attached client exits 128+`sig`, as a
        shell's command would for the Ctrl-C that cancelled it), a running one by SIGTERM,
        then SIGKILL after the grace period."""
        if job.id in self.unwritten:
            return  # it has ended: its end waits for the journal's disk (service.unwritten)
        if job.state == store.PENDING:
            end = partial(self.store.update, job.id, state=store.CANCELLED, ended=time.time())
            unwritten.write(self, job.id, partial(end, reason=None))  # a full disk: kept
            self._ended_attached(job.id, None, sig=sig)
            ended = jobnotify.matched(jobnotify.EVENTS, store.CANCELLED)
            jobnotify.send(self.notifier, job, ended, state=store.CANCELLED, elapsed=0.0)
        elif job.pid:
            if job.id not in self.termed:  # once: a second SIGTERM may abort its checkpoint
                self.signal(job, signal.SIGTERM)
            self.termed.setdefault(job.id, time.monotonic())
            unwritten.note(self, job.id, partial(self.store.update, job.id, reason="cancelling"))

    def _refuse(self, job: store.Job, reason: str) -> None:
        """A job that must start now or not at all (`run` without --wait) that cannot."""
        why = f"no GPU fits now ({reason}); add --wait to queue for one"
        self.store.update(job.id, state=store.CANCELLED, ended=time.time(), error=why, reason=None)
        self.attachments.notify(job.id, {"event": "ended", "status": 75, "error": why})
        self._ended_attached(job.id, None, quiet=True)

    def _ended_attached(
        self, job_id: int, ended: Optional[spawn.Ended], quiet: bool = False, sig: int = SIGTERM
    ) -> None:
        """Tell an attached client how its job ended, and let go of its descriptors."""
        if not quiet:
            status = 128 + sig if ended is None else ended.shell_status
            error = "cancelled before it started" if ended is None else ended.error
            self.attachments.notify(job_id, {"event": "ended", "status": status, "error": error})
        self.attachments.ended(job_id)
        if ended is None:  # ended before it started: no exit record to remove later
            attachment.forget_client(self.exits, str(job_id))

    def schedule(self, full: bool = True) -> None:
        """Plan and start what the plan starts, keeping what stays free (`free`) for a submit
        to judge (service.pacing): a full pass plans and ranks every waiting job, a start
        pass the first few that could start (service.ready), both on service.machine's."""
        from gpuwarden.placement.mig import devices
        from gpuwarden.service.placing import inputs, record_reasons, start_job

        began = time.monotonic()
        unwritten.retry(self)  # ends a full disk kept, written once it has room
        # An attached job whose client has not come back after a restart waits for it.
        waits, more = (self.store.jobs([store.PENDING]), False) if full else self.store.ready()
        kept = self.unwritten  # ended or cancelled, not yet in the journal: left out
        pending = [
            j
            for j in waits
            if (not j.attached or j.id in self.attachments.stdio) and j.id not in kept
        ]
        if not pending:
            self.queue.nothing_waits(full)  # after a full pass: a submit plans at once
            return self.pacer.planned("full" if full else "start", began, time.monotonic())
        # One reading of the configuration for the pass, handed to what it calls: drains,
        # XID logs and health rules change without a reload.
        reading = self.reading = config.load()
        snapshot = self.hardware.current(self.settings.tick)
        units = devices(snapshot)  # MIG slices in place of their GPU: what jobs are given
        self.queue.seen(units)
        running = [j for j in self.store.jobs([store.STARTING, store.RUNNING]) if j.id not in kept]
        pending, throttled = arrays.throttled(pending, running)
        # Only the dependencies waiting jobs name: reading every ended job made each
        # pass grow with the history.
        named = self.store.states(a for j in pending for a in j.after)
        ended = {i: state == store.COMPLETED for i, state in named.items() if state in store.ENDED}
        now = time.time()
        leaving = {*self.termed, *self.preempting}
        gpus, busy, waiting, pick = inputs(
            snapshot, running, pending, self.settings, reading, leaving, self.hardware.linked
        )
        usage = self.store.usage(now, self.settings.policy.half_life)
        policy = limiting.plan_policy(self.settings, self.store, (*pending, *running))
        decisions, victims = preemption.plan(
            gpus,
            busy,
            waiting,
            usage,
            now,
            policy,
            finished={str(k): v for k, v in ended.items()},
            pick=pick,
            bookings=bookings.for_plan(
                bookings.of(self).current(now), {j.user for j in (*pending, *running)}
            ),
        )
        for why in set(victims.values()):  # first: their grace runs from now
            chosen = (self.store.get(int(v)) for v, w in victims.items() if w == why)
            preempting.preempt(self, [j for j in chosen if j is not None], why)
        by_id = {j.id: j for j in pending}
        mem = {i: j.mem for i, j in by_id.items()}
        self.queue.planned(full, gpus, busy, waiting, decisions, now, mem)
        if full:
            self.store.rank(self.queue.priorities)  # the order the next start passes take
        record_reasons(self.store, throttled, decisions, by_id)
        if more:  # what waits beyond the first few may fit: a full pass plans it soon
            self.pacer.touch()
        self.pacer.planned("full" if full else "start", began, time.monotonic(), len(waiting))
        for decision in decisions:
            job = by_id[int(decision.id)]
            if not decision.starts:
                if not job.wait:
                    self._refuse(job, decision.reason or "")
                continue
            if not full:
                self.pacer.touch()  # what `queue` shows of the others moved: refreshed soon
            try:
                started = start_job(self, job, decision.gpus, snapshot, reading)
            except UserError as err:
                why = str(err)
                said = f"job {job.id} could not start: "
                why = why[len(said) :] if why.startswith(said) else why  # said once
                log.warning("job %s could not start: %s", job.id, why)
                self.store.update(
                    job.id, state=store.FAILED, error=why, ended=time.time(), reason=None
                )
                # Its owner's --notify fail hears of it, as of any failed job.
                jobnotify.send(self.notifier, job, ["FAIL"], state=store.FAILED, error=why)
                log.info("job %s ended: %s (it never started)", job.id, store.FAILED)
                continue
            if started is not None:
                self._watch(job.id, started.supervisor, started.pid)
                if jobnotify.wanted(job.request):
                    jobnotify.send(self.notifier, self.store.get(job.id) or job, ["BEGIN"])

    def _watch(self, job_id: int, pid: int, job_pid: Optional[int] = None) -> None:
        """Watch the job's supervisor `pid` for its end, and hold a pidfd of the job's
        own first process `job_pid` to signal it by (service.jobprocess)."""
        try:
            fd = os.pidfd_open(pid)
        except ProcessLookupError:
            self._ended(job_id)
            return
        if job_pid:
            held = jobprocess.claim(job_pid, pid)
            if held is not None:
                self.processes[job_id] = held
        self.watched[job_id] = fd
        self.selector.register(fd, selectors.EVENT_READ, ("job", job_id))

    def _ended(self, job_id: int) -> None:
        fd = self.watched.pop(job_id, None)
        if fd is not None:
            self.selector.unregister(fd)
            os.close(fd)
        held = self.processes.pop(job_id, None)
        if held is not None:
            os.close(held)
        job = self.store.get(job_id)
        if job is None or job.state not in (store.STARTING, store.RUNNING):
            return
        if job.supervisor:
            spawn.wait_supervisor(job.supervisor, timeout=0)
        ended = spawn.read_exit_record(self.exits, str(job_id))
        if ended is not None:
            self._finish(job, ended)
        elif spawn.read_marker(self.exits, str(job_id)) is None:
            self._requeue(job)  # its supervisor never had the go-ahead
        else:
            self._finish(
                job, spawn.Ended(None, None, "its supervisor died", time.time()), store.LOST
            )

    def _finish(self, job: store.Job, ended: spawn.Ended, state: Optional[str] = None) -> None:
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
            self._close_cgroup(job.id, dirs)  # before the leases: leftovers hold their locks
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
            # Removed after the next starts, not on the way from a freed GPU to the next
            # start (`remove_litter`); only once the end is written (service.litter).
            self.litter.extend(litter.of_job(self.exits, job.id))

        unwritten.write(self, job.id, record)  # a full disk: kept, written when it has room
        self.termed.pop(job.id, None)
        self._ended_attached(job.id, ended)
        jobnotify.send(
            self.notifier,
            job,
            jobnotify.matched(jobnotify.EVENTS, state),
            state=state,
            exit_code=ended.code,
            signal=ended.signal,
            elapsed=(ended.at or now) - started,
        )
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
                "elapsed": (ended.at or now) - started,
                "host": os.uname().nodename,
            }
        )
        log.info("job %s ended: %s", job.id, state)
        self.pacer.wake()

    def ran(self, job: store.Job, ended: float, state: str, gpu_seconds: float) -> None:
        """A run of `job` ended: kept for `report` (service.accounting), with what the
        sampler saw of its GPUs for `eff`; inside the caller's commit."""
        from gpuwarden.service import accounting

        run = accounting.record_run(self.store.db, job, ended, state, gpu_seconds)
        charged = gpu_seconds * preempting.charge(self.settings, job)  # as the user's
        half_life = self.settings.policy.half_life
        accounting.charge_account(self.store.db, job.account, job.user, charged, ended, half_life)
        if self.sampler is not None:
            accounting.save_use(self.store.db, job.id, run, self.sampler.take(job.id))
        if self.usage_totals is not None:  # last: a failed write above adds nothing
            key = (job.user, job.account or "")
            self.usage_totals[key] = self.usage_totals.get(key, 0.0) + max(0.0, gpu_seconds)

    def remove_litter(self) -> None:
        """Remove the exit records and markers of jobs whose end is committed, once
        that commit is on disk: until then a power cut would leave the journal
        without the end and the disk without the record of it."""
        if self.litter:
            self.store.sync()
        litter.remove(self.litter)
        self.litter.clear()
