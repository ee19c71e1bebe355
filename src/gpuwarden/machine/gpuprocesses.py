"""Who holds a context on a GPU: NVML's process lists, with each process's owner.

NVML names only a pid; the user and command come from the kernel (psutil, loaded
only when a GPU has processes) or, on the simulated machine, from the simulator's
own table, since its processes have no /proc entry. `inventory` calls this once
per GPU while it reads a snapshot. How much of a shared GPU's work is each process's
(NVML's per-process utilisation) is read apart, by the efficiency sampler only.
"""

from __future__ import annotations

from gpuwarden.base.records import record

TYPE_CHECKING = False  # typing stays off the start-up path
if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Mapping
    from typing import Any, Optional

    # (GPU instance id, compute instance id) -> the MIG device's UUID
    MigUuids = dict[tuple[Optional[int], Optional[int]], str]


@record
class GpuProcess:
    """A process holding a context on a GPU (NVML's compute or graphics list)."""

    pid: int
    used_memory: Optional[int]  # bytes; None when NVML does not say (e.g. under MIG)
    user: Optional[str] = None
    command: Optional[str] = None
    kind: str = "compute"  # "compute" or "graphics"
    mig_uuid: Optional[str] = None  # the MIG instance it runs in, if any


class SimOwners:
    """Users and commands of simulated processes (they have no /proc entry).

    Read when first asked and once more on a miss: a process registered while this
    snapshot is being taken would otherwise reach psutil and show as its real owner.
    On a real machine there is no table and every lookup misses at once."""

    def __init__(self, table: Any) -> None:
        self._table = table
        self._known: Optional[dict[int, Any]] = None

    def get(self, pid: int) -> Any:
        if self._table is None:
            return None
        if self._known is None or pid not in self._known:
            self._known = self._table()
        return self._known.get(pid)


def read_processes(
    get: Callable[..., Any], handle: Any, mig_uuids: MigUuids, known: SimOwners
) -> tuple[GpuProcess, ...]:
    """The compute and graphics processes on one GPU; `get` is the inventory's NVML
    call (None for what the card cannot say)."""
    seen = []
    for kind, func in (
        ("compute", "nvmlDeviceGetComputeRunningProcesses"),
        ("graphics", "nvmlDeviceGetGraphicsRunningProcesses"),
    ):
        for p in get(func, handle) or ():
            mem = p.usedGpuMemory
            mig_uuid = mig_uuids.get(
                (getattr(p, "gpuInstanceId", None), getattr(p, "computeInstanceId", None))
            )
            seen.append((int(p.pid), int(mem) if mem is not None else None, kind, mig_uuid))
    result = []
    for pid, mem, kind, mig_uuid in seen:
        user, command = known.get(pid) or _owner(pid)
        result.append(
            GpuProcess(
                pid=pid, used_memory=mem, user=user, command=command, kind=kind, mig_uuid=mig_uuid
            )
        )
    return tuple(result)


def _owner(pid: int) -> tuple[Optional[str], Optional[str]]:
    """User and command line of a local process (psutil imported only when needed)."""
    import psutil

    try:
        proc = psutil.Process(pid)
        with proc.oneshot():
            user = proc.username()
            cmdline = proc.cmdline()
        return user, " ".join(cmdline) if cmdline else proc.name()
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess, KeyError, OSError):
        return None, None


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
