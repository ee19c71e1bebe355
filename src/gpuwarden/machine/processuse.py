"""Each process's use of a shared GPU, for the queue service's efficiency sampler:
NVML's per-process utilisation samples, and the driver's accounting records for each
process's memory peak. A module apart from `gpuprocesses`: `run` and `status`, which
read who holds a GPU, load none of it.
"""

from __future__ import annotations

from gpuwarden.base.records import record

TYPE_CHECKING = False  # typing stays off the start-up path
if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping
    from typing import Any


@record
class ProcessUse:
    """One process's share of a GPU's work since a moment (NVML's per-process
    utilisation samples): what a job sharing the GPU did, apart from the others."""

    pid: int
    sm: float  # percent of the time its kernels ran, the mean of its samples
    memory: float  # percent of the time it read or wrote memory, likewise
    samples: int


def read_process_use(nv: Any, uuids: Iterable[str], since: int) -> dict[str, dict[int, ProcessUse]]:
    """GPU UUID -> pid -> its use since `since` (microseconds since the epoch, NVML's
    clock). A GPU no process ran on since maps to {}; one whose driver keeps no such
    samples (or lost) is absent: never raises for what NVML cannot say. `nv` is
    initialised by the caller."""
    out: dict[str, dict[int, ProcessUse]] = {}
    for uuid in uuids:
        try:
            handle = nv.nvmlDeviceGetHandleByUUID(uuid.encode())
        except nv.NVMLError:
            continue  # gone (lost, or not this machine's)
        try:
            samples = nv.nvmlDeviceGetProcessUtilization(handle, since)
        except nv.NVMLError_NotFound:
            samples = []  # no samples since: no process ran a kernel on it
        except nv.NVMLError:
            continue  # not supported here, or lost
        sums: dict[int, list[float]] = {}
        for sample in samples:
            if int(sample.timeStamp) < since:
                continue
            got = sums.setdefault(int(sample.pid), [0.0, 0.0, 0.0])
            got[0] += float(sample.smUtil)
            got[1] += float(sample.memUtil)
            got[2] += 1
        out[uuid] = {
            pid: ProcessUse(pid, sm / n, mem / n, int(n)) for pid, (sm, mem, n) in sums.items()
        }
    return out


def read_memory_peaks(nv: Any, pids: Mapping[str, Iterable[int]]) -> dict[str, dict[int, int]]:
    """GPU UUID -> pid -> the most GPU memory (bytes) that process held on it, from the
    driver's accounting records (`nvmlDeviceGetAccountingStats`'s maxMemoryUsage), for
    the `pids` asked of each GPU. A GPU whose accounting mode is off (the driver's
    default), or that NVML cannot read, is absent; a pid it has no record of is left
    out. `nv` is initialised by the caller."""
    out: dict[str, dict[int, int]] = {}
    for uuid, wanted in pids.items():
        try:
            handle = nv.nvmlDeviceGetHandleByUUID(uuid.encode())
            if not nv.nvmlDeviceGetAccountingMode(handle):
                continue
        except nv.NVMLError:
            continue
        peaks: dict[int, int] = {}
        for pid in wanted:
            try:
                stats = nv.nvmlDeviceGetAccountingStats(handle, pid)
            except nv.NVMLError:
                continue  # no record (started before the mode went on), or unreadable
            if stats.maxMemoryUsage is not None:
                peaks[int(pid)] = int(stats.maxMemoryUsage)
        out[uuid] = peaks
    return out
