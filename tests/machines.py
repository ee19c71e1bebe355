"""Hand-built snapshots the lease tests share: no NVML, no simulator."""

from __future__ import annotations

import time

from gpuwarden.inventory import Gpu, Snapshot

GiB = 2**30


def idle_a100s(n: int, total: int = 80 * GiB) -> Snapshot:
    """`n` idle A100s of `total` bytes, UUIDs GPU-0000000i-0000-..., taken now."""
    gpus = tuple(
        Gpu(
            index=i,
            uuid=f"GPU-{i:08x}-0000-0000-0000-000000000000",
            name="NVIDIA A100-SXM4-80GB",
            memory_total=total,
            memory_used=0,
            memory_free=total,
            utilization_gpu=0,
            compute_capability=(8, 0),
        )
        for i in range(n)
    )
    return Snapshot(taken_at=time.time(), hostname="test", gpus=gpus)
