"""The GPUs of the service's running jobs, sampled for `gpuwarden eff`.

On the loop's tick, every `service.sample_seconds` (10 s) while a job runs, one
reading of the machine (with power and energy), and for GPUs that jobs share, NVML's
per-process utilisation since the last sample and, where the driver's accounting mode
is on, each process's own memory peak, add a sample per GPU of each running
job to that run's summary in memory (gpuwarden.usage.efficiency says what is measured
where). The summaries go to the journal's `gpu_use` every `FLUSH_EVERY`
seconds and when the run ends (service.accounting), never a row per sample; a
restarted service carries on from what was last written. Nothing here runs on a
scheduling pass.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Optional

from gpuwarden.service import accounting, store
from gpuwarden.usage import efficiency
from gpuwarden.usage.efficiency import GpuUse

log = logging.getLogger("gpuwarden.serve")

#: Seconds between two writes of the running jobs' summaries to the journal.
FLUSH_EVERY = 60.0


class Sampler:
    def __init__(
        self,
        every: float,
        read: Callable[[], Any],
        process_use: Optional[Callable[[list[str], int], Mapping[str, Any]]] = None,
        memory_peaks: Optional[Callable[[dict[str, set[int]]], Mapping[str, Any]]] = None,
    ) -> None:
        self.every = every
        self.read = read  # a Snapshot with power and energy (inventory.read_snapshot)
        # Per-process utilisation on shared GPUs (processuse.read_process_use): GPU
        # UUID -> pid -> ProcessUse since a moment in microseconds; None: not read.
        self.process_use = process_use
        # Each process's own GPU-memory peak where the driver's accounting mode is on
        # (processuse.read_memory_peaks): GPU UUID -> pid -> bytes; None: not read.
        self.memory_peaks = memory_peaks
        self.last: Optional[float] = None
        self.flushed = time.time()
        self.uses: dict[int, dict[str, GpuUse]] = {}  # job id -> GPU -> its run's summary
        self.energy: dict[str, float] = {}  # GPU -> its energy counter at the last sample

    def due(self, now: float) -> bool:
        return self.every > 0 and (self.last is None or now - self.last >= self.every)

    def step(
        self,
        journal: store.Store,
        running: Iterable[store.Job],
        now: float,
        pids_of: Callable[[store.Job], set[int]],
    ) -> None:
        """One sample of every running job's GPUs; `pids_of` the processes of a job that
        shares its GPUs (its cgroup's)."""
        jobs = [j for j in running if j.gpus]
        if not jobs:
            self.last, self.energy = now, {}
            return
        seconds = self.every if self.last is None else min(now - self.last, 2 * self.every)
        snapshot = self.read()
        gpus: dict[str, Any] = {}
        for gpu in snapshot.gpus:
            gpus[gpu.uuid] = gpu
            for mig in gpu.mig_instances:
                gpus[mig.uuid] = mig
        energy = {g.uuid: g.energy_consumed for g in snapshot.gpus if g.energy_consumed}
        shared = self._shared_use(jobs, now, seconds)
        owned = {j.id: pids_of(j) for j in jobs if j.mem is not None}
        peaks = self._peaks(jobs, owned)
        for job in jobs:
            mine = self.uses.get(job.id)
            span = seconds
            if mine is None:
                mine = self.uses[job.id] = self._resumed(journal, job)
                if not mine:  # its first sample: it ran this long, not a whole period
                    span = min(seconds, max(0.0, now - (job.started or now)))
            pids: Optional[set[int]] = None
            for uuid in job.gpus:
                gpu = gpus.get(uuid)
                if gpu is None or getattr(gpu, "lost", False):
                    continue
                alone = job.mem is None and hasattr(gpu, "utilization_gpu")
                if alone:
                    spent = None
                    if uuid in energy and uuid in self.energy and span == seconds:
                        spent = max(0.0, energy[uuid] - self.energy[uuid])
                    elif gpu.power_draw is not None:
                        spent = gpu.power_draw * span
                    mine[uuid] = efficiency.add(
                        mine.get(uuid),
                        uuid,
                        span,
                        gpu.utilization_gpu,
                        gpu.memory_used,
                        gpu.memory_total,
                        spent,
                        "gpu",
                    )
                    continue
                if pids is None:
                    pids = owned[job.id] if job.id in owned else pids_of(job)
                procs = getattr(gpu, "processes", ()) or self._processes_of(snapshot, uuid)
                used = sum(p.used_memory or 0 for p in procs if p.pid in pids)
                # its processes' own peaks, between samples too (the sum: at most what
                # they held together), where the driver keeps accounting records
                peak = sum(m for pid, m in peaks.get(uuid, {}).items() if pid in pids)
                util = None
                if uuid in shared:  # its processes' own kernels' share of the time
                    util = min(100.0, sum(u.sm for pid, u in shared[uuid].items() if pid in pids))
                mine[uuid] = efficiency.add(
                    mine.get(uuid),
                    uuid,
                    span,
                    util,
                    max(used, peak),
                    job.mem or gpu.memory_total,
                    None,
                    "process",
                )
        self.energy = energy
        self.last = now
        if now - self.flushed >= FLUSH_EVERY:
            self.flush(journal, jobs)

    def _shared_use(self, jobs: list[store.Job], now: float, seconds: float) -> Mapping[str, Any]:
        """The per-process use, since the last sample, of the GPUs shared jobs hold."""
        uuids = sorted({u for j in jobs if j.mem is not None for u in j.gpus})
        if not uuids or self.process_use is None:
            return {}
        try:
            return self.process_use(uuids, int((now - seconds) * 1e6))
        except Exception:  # NVML refusing this must not stop the GPU-level samples
            log.debug("per-process utilisation unreadable", exc_info=True)
            return {}

    def _peaks(self, jobs: list[store.Job], owned: Mapping[int, set[int]]) -> Mapping[str, Any]:
        """The accounting records' memory peaks of shared jobs' processes, per GPU."""
        pids: dict[str, set[int]] = {}
        for job in jobs:
            for uuid in job.gpus if job.id in owned else ():
                pids.setdefault(uuid, set()).update(owned[job.id])
        if not pids or self.memory_peaks is None:
            return {}
        try:
            return self.memory_peaks(pids)
        except Exception:  # as for the utilisation: the GPU-level samples go on
            log.debug("accounting records unreadable", exc_info=True)
            return {}

    @staticmethod
    def _processes_of(snapshot: Any, uuid: str) -> tuple[Any, ...]:
        """The processes in a MIG slice: listed on its GPU with the slice's UUID."""
        for gpu in snapshot.gpus:
            if any(m.uuid == uuid for m in gpu.mig_instances):
                return tuple(p for p in gpu.processes if p.mig_uuid == uuid)
        return ()

    def _resumed(self, journal: store.Store, job: store.Job) -> dict[str, GpuUse]:
        """What was written of the job's current run before a restart."""
        run = accounting.current_run(journal.db, job.id)
        return {u.gpu: u for u in accounting.use_of(journal.db, job.id).get(run, [])}

    def flush(self, journal: store.Store, running: Iterable[store.Job]) -> None:
        """The running jobs' summaries to the journal: one commit, not made durable
        (a power cut loses at most this minute's)."""
        self.flushed = time.time()
        active = {j.id for j in running}
        for gone in set(self.uses) - active:
            del self.uses[gone]  # ended without `take` (the journal has its end)
        if not self.uses:
            return
        with journal.transaction(durable=False):
            for job_id, uses in self.uses.items():
                run = accounting.current_run(journal.db, job_id)
                accounting.save_use(journal.db, job_id, run, uses.values())

    def take(self, job_id: int) -> list[GpuUse]:
        """The summaries of a run that ended (saved with its end), forgotten here."""
        return list(self.uses.pop(job_id, {}).values())

    def peek(self, job_id: int) -> list[GpuUse]:
        return list(self.uses.get(job_id, {}).values())


def job_pids(dirs: Mapping[str, str]) -> set[int]:
    """The processes in a job's cgroup."""
    from gpuwarden.cgroups.accounting import pids_in

    where = dirs.get("devices", dirs.get(""))
    return set(pids_in(where)) if where else set()
