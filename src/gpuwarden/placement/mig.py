"""MIG devices as units of placement: what a job can be given on a GPU in MIG mode.

CUDA cannot use a GPU in MIG mode as a whole, and shows a process one MIG device
only, named by its `MIG-` UUID (docs/cuda-visible-devices.md, "MIG"). Selection
therefore replaces such a GPU by its MIG devices, each a `Gpu` of its own whose
`uuid` is the MIG UUID (what a lease holds and what a child is given). Pure
functions over a `Snapshot`, like `gpuwarden.placement.selection`.
"""

from __future__ import annotations

TYPE_CHECKING = False  # the snapshot types name annotations only: inventory stays unloaded
if TYPE_CHECKING:
    from gpuwarden.machine.inventory import Gpu, Snapshot


def is_mig(gpu: Gpu) -> bool:
    """A MIG device as `devices()` gives it (its `uuid` is the `MIG-` one)."""
    return gpu.uuid.startswith("MIG-")


def devices(snapshot: Snapshot) -> tuple[Gpu, ...]:
    """What a job can be given: each GPU, except that a GPU in MIG mode is replaced by
    its MIG devices, in NVML order. CUDA cannot use a MIG-mode GPU as a whole, and
    shows a process its MIG devices only by their `MIG-` UUIDs (docs/cuda-visible-
    devices.md), so each is a unit of its own: `uuid` is the MIG UUID (what a lease
    holds), `index` the parent's, memory the device's own, and processes those in it.
    NVML reports no utilization per MIG device: a device with no process in it counts
    as idle (0%), one with a process as unknown."""
    from dataclasses import replace

    found: list[Gpu] = []
    for gpu in snapshot.gpus:
        if not gpu.mig_mode or not gpu.mig_instances:
            found.append(gpu)  # MIG mode with no MIG device: choose() says why not
            continue
        for inst in sorted(gpu.mig_instances, key=lambda m: m.index):
            procs = tuple(p for p in gpu.processes if p.mig_uuid == inst.uuid)
            total, used = inst.memory_total, inst.memory_used
            computing = any(p.kind == "compute" for p in procs)
            found.append(
                replace(
                    gpu,
                    uuid=inst.uuid,
                    name=f"{gpu.name} MIG {inst.name}" if gpu.name and inst.name else gpu.name,
                    memory_total=total,
                    memory_used=used,
                    memory_free=None if total is None or used is None else max(0, total - used),
                    utilization_gpu=None if computing else 0,
                    processes=procs,
                    mig_mode=False,
                    mig_instances=(),
                )
            )
    return tuple(found)


def label(gpu: Gpu) -> str:
    """ "GPU 3", or "GPU 3 MIG-44d5e7c7…" for a MIG device, for reasons and listings."""
    return f"GPU {gpu.index} {gpu.uuid}" if is_mig(gpu) else f"GPU {gpu.index}"
