"""Who holds a context on a GPU: NVML's process lists, with each process's owner.

NVML names only a pid; the user and command come from the kernel (psutil, loaded
only when a GPU has processes) or, on the simulated machine, from the simulator's
own table, since its processes have no /proc entry. `inventory` calls this once
per GPU while it reads a snapshot. How much of a shared GPU's work is each process's
is `processuse`'s, read by the efficiency sampler only.
"""

from __future__ import annotations

from gpuwarden.base.records import record

TYPE_CHECKING = False  # typing stays off the start-up path
if TYPE_CHECKING:
    from collections.abc import Callable
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
