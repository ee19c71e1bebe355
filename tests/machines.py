"""Hand-built snapshots the tests share: no NVML, no simulator.

`card()` is one idle A100 and `snapshot()` a machine of given cards; a test changes only
the fields it is about (`card(3, utilization_gpu=95)`), so what it checks stands out.
"""

from __future__ import annotations

import time
from typing import Any, Optional

from gpuwarden.machine.inventory import Gpu, GpuProcess, Snapshot

GiB = 2**30


def card(index: int, **fields: Any) -> Gpu:
    """An idle A100-SXM4-80GB at `index`, `fields` overriding. Its UUID (GPU-11000000-aaaa-...
    for GPU 1) differs from the others' in its first digits, as UUID prefixes do."""
    total = fields.get("memory_total", 80 * GiB)
    gpu: dict[str, Any] = {
        "index": index,
        "uuid": f"GPU-{index:x}{index:x}000000-aaaa-bbbb-cccc-{index:012x}",
        "name": "NVIDIA A100-SXM4-80GB",
        "memory_total": total,
        "memory_used": 0,
        "memory_free": total - fields.get("memory_used", 0),
        "utilization_gpu": 0,
        "compute_capability": (8, 0),
    }
    gpu.update(fields)
    return Gpu(**gpu)


def snapshot(
    *gpus: Gpu, taken_at: Optional[float] = None, hostname: str = "box", **fields: Any
) -> Snapshot:
    """A machine of `gpus`, taken now unless `taken_at` says when; `fields` as Snapshot's."""
    when = time.time() if taken_at is None else taken_at
    return Snapshot(taken_at=when, hostname=hostname, gpus=tuple(gpus), **fields)


def idle_a100s(n: int, total: int = 80 * GiB) -> Snapshot:
    """`n` idle A100s of `total` bytes, taken now."""
    return snapshot(*(card(i, memory_total=total) for i in range(n)), hostname="test")


def busy_box(t: float = 1000.0, util0: int = 50) -> Snapshot:
    """Three A100-40GB as an exporter sees them: GPU 0 at `util0`% with two users' jobs and
    every counter read, GPU 1 with a notebook, GPU 2 lost."""
    return Snapshot(
        taken_at=t,
        hostname="box",
        driver_version="550.54.15",
        gpus=(
            Gpu(
                index=0,
                uuid="GPU-aaaa",
                name="NVIDIA A100-SXM4-40GB",
                memory_total=40 * GiB,
                memory_used=10 * GiB,
                memory_free=30 * GiB,
                utilization_gpu=util0,
                utilization_memory=20,
                temperature=61,
                power_draw=250.5,
                energy_consumed=12345.0,
                clock_sm=1410,
                ecc_corrected_volatile=3,
                ecc_uncorrected_volatile=0,
                pcie_replay_count=0,
                processes=(
                    GpuProcess(101, 6 * GiB, "alice", "python train.py"),
                    GpuProcess(102, 4 * GiB, "bob", "python eval.py"),
                ),
            ),
            Gpu(
                index=1,
                uuid="GPU-bbbb",
                name="NVIDIA A100-SXM4-40GB",
                memory_total=40 * GiB,
                memory_used=2 * GiB,
                memory_free=38 * GiB,
                utilization_gpu=0,
                processes=(GpuProcess(103, 2 * GiB, "alice", "jupyter"),),
            ),
            Gpu(index=2, uuid="GPU-cccc", name="NVIDIA A100-SXM4-40GB", lost=True, error="lost"),
        ),
    )
