"""How well a job used the GPUs it held: `gpuwarden eff` (as seff and jobstats).

Pure: samples in, summaries and flags out. The service's sampler (service.sampler)
adds one sample per GPU of each running job every `service.sample_seconds`, each
weighted by the time since the last (at most two periods, so a stalled service
never inflates a job), into one `GpuUse` per run and GPU; the journal keeps those
summaries, not the samples.

What is measured where:
- a GPU the job holds alone (no `--mem`): the GPU's own counters, which are the
  job's: utilisation (the share of time a kernel ran, NVML's `utilization.gpu`),
  memory used, power (energy from the GPU's energy counter where it has one, else
  power x time);
- a GPU the job shares (`--mem`): its own processes' figures: their memory on it
  (NVML's per-process list; where the GPU's accounting mode is on, at least the sum
  of their own peaks from the driver's records, `maxMemoryUsage`) and the share of
  the time their kernels ran (NVML's per-process utilisation samples, summed over
  the job's processes), where the
  driver keeps those; energy belongs to the GPU, not the job, and is not given (n/a).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple, Optional

#: A GPU counts as busy in a sample at this utilisation (percent) or more.
BUSY_PERCENT = 5.0
#: A job is flagged idle when its GPUs were busy less than this share of the time.
IDLE_SHARE = 0.5
#: ... and for memory far below what it held when its peak is under this share.
MEMORY_SHARE = 0.25


class GpuUse(NamedTuple):
    """What one GPU of one run did, summed over the samples."""

    gpu: str
    seconds: float  # sampled time
    util_seconds: Optional[float]  # utilisation (percent) x seconds
    busy_seconds: Optional[float]  # seconds it was seen busy
    mem_peak: Optional[int]  # bytes
    mem_total: Optional[int]  # bytes: the GPU's, or the --mem it declared
    energy: Optional[float]  # joules
    level: str  # "gpu": the job held it alone; "process": its processes' share


def _plus(a: Optional[float], b: Optional[float]) -> Optional[float]:
    if a is None:
        return b
    return a if b is None else a + b


def add(
    use: Optional[GpuUse],
    gpu: str,
    seconds: float,
    util: Optional[float],
    mem: Optional[int],
    mem_total: Optional[int],
    energy: Optional[float],
    level: str,
) -> GpuUse:
    """`use` with one more sample of `seconds`: utilisation `util` (percent), memory
    `mem` (bytes) of `mem_total`, `energy` joules spent since the last sample."""
    base = use or GpuUse(gpu, 0.0, None, None, None, mem_total, None, level)
    peak = base.mem_peak if mem is None else max(mem, base.mem_peak or 0)
    return GpuUse(
        gpu,
        base.seconds + seconds,
        _plus(base.util_seconds, None if util is None else util * seconds),
        _plus(base.busy_seconds, None if util is None else seconds * (util >= BUSY_PERCENT)),
        peak,
        mem_total if mem_total is not None else base.mem_total,
        _plus(base.energy, energy),
        level,
    )


def mean_util(use: GpuUse) -> Optional[float]:
    """Mean utilisation (percent) over the sampled time; None where not measured."""
    if use.util_seconds is None or use.seconds <= 0:
        return None
    return use.util_seconds / use.seconds


def flags(uses: Sequence[GpuUse], labels: Sequence[str]) -> list[str]:
    """What a lab admin would tell the job's owner: a GPU never used, memory far below
    what it held, GPUs idle most of the time. `labels` name the GPUs as `uses`."""
    out = []
    for use, label in zip(uses, labels):
        if use.level == "gpu" and use.seconds > 0 and use.busy_seconds == 0:
            out.append(f"GPU {label} was never used")
    for use, label in zip(uses, labels):
        held = use.mem_total
        if use.mem_peak is not None and held and use.mem_peak < MEMORY_SHARE * held:
            out.append(
                f"GPU {label}: memory peaked at {_gib(use.mem_peak)} of the {_gib(held)} it held"
            )
    seconds = sum(u.seconds for u in uses if u.busy_seconds is not None)
    busy = sum(u.busy_seconds or 0.0 for u in uses)
    if seconds > 0 and busy / seconds < IDLE_SHARE:
        out.append(f"its GPUs were idle {100 * (1 - busy / seconds):.0f}% of the time")
    return out


def _gib(size: int) -> str:
    from gpuwarden.base.units import format_size

    return format_size(size)
