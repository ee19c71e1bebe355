"""Time limits of the service's jobs, on the loop's tick: Slurm's `--signal` warning
before the limit, SIGTERM once at it, SIGKILL after the grace period (a cancel that
was ignored too), with the periodic chores that share the tick (the enforcement
watcher, the sweep of ended jobs' cgroups, orphaned attached jobs). Over the job's
life (service.lifecycle).
"""

from __future__ import annotations

import contextlib
import logging
import signal
import time
from functools import partial

from gpuwarden import scheduling
from gpuwarden.service import digests, jobprocess, preempting, unwritten
from gpuwarden.service.lifecycle import Lifecycle
from gpuwarden.service.store import RUNNING, Job

log = logging.getLogger("gpuwarden.serve")

SWEEP_EVERY = 10.0  # seconds between looks for cgroups of ended jobs left non-empty


class TimeLimits(Lifecycle):
    def _enforce_time_limits(self) -> None:
        if self.orphans:
            self._end_orphans()
        now = time.time()
        if now - self.swept >= SWEEP_EVERY:  # on the loop's tick
            self.swept = now
            self.sweep_cgroups()
        watch = self.watcher()
        if watch.due(now):
            try:
                watch.step(now)
            except Exception:  # a reading that fails must not take the queue down
                log.exception("the enforcement watcher failed")
                watch.last = now
        preempting.kill_overdue(self)
        self.digested = digests.tick(self, now, self.digested)
        # Not those whose end waits for the journal's disk (service.unwritten): ended.
        running = [j for j in self.store.jobs([RUNNING]) if j.id not in self.unwritten]
        self._sample(running, now)
        for job in running:
            sent = self.termed.get(job.id)
            if sent is not None and job.pid and time.monotonic() - sent >= self.settings.grace:
                self.signal(job, signal.SIGKILL)  # a cancel or limit ignored SIGTERM
        for job in running:
            self._warn(job, now)
        views = [
            scheduling.Running(str(j.id), j.user, j.gpus, j.started or now, j.mem, j.time_limit)
            for j in running
        ]
        by_id = {j.id: j for j in running}
        for job_id, action in scheduling.overdue(views, now, self.settings.grace):
            job = by_id[int(job_id)]
            if not job.pid:
                continue
            if action == scheduling.TERM and int(job_id) not in self.termed:
                self.signal(job, signal.SIGTERM)
                self.termed[int(job_id)] = time.monotonic()
                why = partial(self.store.update, job.id, reason="time limit")
                unwritten.note(self, job.id, why)
                log.info("job %s past its time limit: SIGTERM", job_id)
            elif action == scheduling.KILL:
                self.signal(job, signal.SIGKILL)

    def _sample(self, running: list[Job], now: float) -> None:
        """The running jobs' GPUs, every `service.sample_seconds` (service.sampler)."""
        if self.sampler is None:
            from gpuwarden.service.sampler import Sampler

            # Its reading is the service's (service.machine): counted, and planned on.
            self.sampler = Sampler(
                self.settings.sample_seconds,
                lambda: self.hardware.read(detail=True),
                self.hardware.process_use,
            )
        sampler = self.sampler
        sampler.every = self.settings.sample_seconds  # as a reload left it
        if not sampler.due(now):
            return
        try:
            sampler.step(self.store, running, now, self._pids_of)
        except Exception:  # a reading that fails must not take the queue down
            log.exception("the GPU sampler failed")
            sampler.last = now

    def _pids_of(self, job: Job) -> set[int]:
        """The processes of a job: its cgroup's, else those below its supervisor."""
        dirs = self.job_cgroup(job.id)
        if dirs:
            from gpuwarden.service.sampler import job_pids

            return job_pids(dirs)
        from gpuwarden.service.tree import descendants

        return set(descendants(job.supervisor)) if job.supervisor else set()

    def _warn(self, job: Job, now: float) -> None:
        """Slurm's --signal: its signal, once, `before` seconds ahead of the time limit
        (the journal's reason says it was sent, also to a restarted service)."""
        warning = job.request.get("signal")
        if not warning or job.time_limit is None or not job.pid or job.reason is not None:
            return
        number, before, batch = warning
        if now < (job.started or now) + job.time_limit - before:
            return
        pidfd = self.processes.get(job.id)
        if batch and pidfd is not None and not jobprocess.exited(pidfd):
            with contextlib.suppress(ProcessLookupError):
                signal.pidfd_send_signal(pidfd, number)
        elif not batch:
            self.signal(job, number)
        self.store.update(job.id, durable=False, reason="signalled")
        log.info("job %s: signal %s, %gs before its time limit", job.id, number, before)
