"""Time limits of the service's jobs, on the loop's tick: Slurm's `--signal` warning
before the limit, SIGTERM once at it, SIGKILL after the grace period (a cancel that
was ignored too), with the periodic chores that share the tick (the enforcement
watcher, the sweep of ended jobs' cgroups). Of the jobs' life, what `TickService`
names.
"""

from __future__ import annotations

import contextlib
import logging
import signal
import time
from functools import partial
from typing import TYPE_CHECKING

from gpuwarden.planning import scheduling
from gpuwarden.service import digests, jobprocess, preempting, unwritten
from gpuwarden.service.store import RUNNING, Job

if TYPE_CHECKING:
    from typing import Optional, Protocol

    from gpuwarden.service.machine import Machine
    from gpuwarden.service.notify import JobNotifier
    from gpuwarden.service.preempting import PreemptingService
    from gpuwarden.service.sampler import Sampler
    from gpuwarden.service.unwritten import Keeping
    from gpuwarden.service.watching import ServiceWatch

    class TickService(PreemptingService, Keeping, Protocol):
        """What the tick needs of the jobs' life (`joblife.JobLife` has it)."""

        hardware: Machine
        notifier: JobNotifier
        termed: dict[int, float]  # job id -> when SIGTERM was sent for its time
        swept: float  # when the cgroups of ended jobs were last looked for
        digested: float  # when due digests were last looked for (service.digests)
        sampler: Optional[Sampler]

        def sweep_cgroups(self) -> None: ...

        def watcher(self) -> ServiceWatch: ...

        def job_cgroup(self, job_id: int) -> dict[str, str]: ...


log = logging.getLogger("gpuwarden.serve")

SWEEP_EVERY = 10.0  # seconds between looks for cgroups of ended jobs left non-empty


def tick(service: TickService) -> None:
    """The tick's round: time limits, the warnings before them, preempted jobs past
    their grace, the enforcement watch, the sampler and the sweep of cgroups."""
    now = time.time()
    if now - service.swept >= SWEEP_EVERY:  # on the loop's tick
        service.swept = now
        service.sweep_cgroups()
    watch = service.watcher()
    if watch.due(now):
        try:
            watch.step(now)
        except Exception:  # a reading that fails must not take the queue down
            log.exception("the enforcement watcher failed")
            watch.last = now
    preempting.kill_overdue(service)
    service.digested = digests.tick(service, now, service.digested)
    # Not those whose end waits for the journal's disk (service.unwritten): ended.
    running = [j for j in service.store.jobs([RUNNING]) if j.id not in service.unwritten]
    _sample(service, running, now)
    for job in running:
        sent = service.termed.get(job.id)
        if sent is not None and job.pid and time.monotonic() - sent >= service.settings.grace:
            service.signal(job, signal.SIGKILL)  # a cancel or limit ignored SIGTERM
    for job in running:
        _warn(service, job, now)
    views = [
        scheduling.Running(str(j.id), j.user, j.gpus, j.started or now, j.mem, j.time_limit)
        for j in running
    ]
    by_id = {j.id: j for j in running}
    for job_id, action in scheduling.overdue(views, now, service.settings.grace):
        job = by_id[int(job_id)]
        if not job.pid:
            continue
        if action == scheduling.TERM and int(job_id) not in service.termed:
            service.signal(job, signal.SIGTERM)
            service.termed[int(job_id)] = time.monotonic()
            why = partial(service.store.update, job.id, reason="time limit")
            unwritten.note(service, job.id, why)
            log.info("job %s past its time limit: SIGTERM", job_id)
        elif action == scheduling.KILL:
            service.signal(job, signal.SIGKILL)


def _sample(service: TickService, running: list[Job], now: float) -> None:
    """The running jobs' GPUs, every `service.sample_seconds` (service.sampler)."""
    if service.sampler is None:
        from gpuwarden.service.sampler import Sampler

        # Its reading is the service's (service.machine): counted, and planned on.
        service.sampler = Sampler(
            service.settings.sample_seconds,
            lambda: service.hardware.read(detail=True),
            service.hardware.process_use,
            service.hardware.memory_peaks,
        )
    sampler = service.sampler
    sampler.every = service.settings.sample_seconds  # as a reload left it
    if not sampler.due(now):
        return
    try:
        sampler.step(service.store, running, now, partial(_pids_of, service))
    except Exception:  # a reading that fails must not take the queue down
        log.exception("the GPU sampler failed")
        sampler.last = now


def _pids_of(service: TickService, job: Job) -> set[int]:
    """The processes of a job: its cgroup's, else those below its supervisor."""
    dirs = service.job_cgroup(job.id)
    if dirs:
        from gpuwarden.service.sampler import job_pids

        return job_pids(dirs)
    from gpuwarden.service.tree import descendants

    return set(descendants(job.supervisor)) if job.supervisor else set()


def _warn(service: TickService, job: Job, now: float) -> None:
    """Slurm's --signal: its signal, once, `before` seconds ahead of the time limit
    (the journal's reason says it was sent, also to a restarted service)."""
    warning = job.request.get("signal")
    if not warning or job.time_limit is None or not job.pid or job.reason is not None:
        return
    number, before, batch = warning
    if now < (job.started or now) + job.time_limit - before:
        return
    pidfd = service.processes.get(job.id)
    if batch and pidfd is not None and not jobprocess.exited(pidfd):
        with contextlib.suppress(ProcessLookupError):
            signal.pidfd_send_signal(pidfd, number)
    elif not batch:
        service.signal(job, number)
    service.store.update(job.id, durable=False, reason="signalled")
    log.info("job %s: signal %s, %gs before its time limit", job.id, number, before)
