"""Small helpers the checks share (naming GPUs, choosing the install line)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Optional

from gpuwarden.doctor import cuda_compat
from gpuwarden.doctor.facts import Facts
from gpuwarden.machine.inventory import Gpu

if TYPE_CHECKING:
    from gpuwarden.placement.visible import Resolution

_RESOLVED: dict[int, tuple[Facts, Resolution]] = {}


def resolution(facts: Facts) -> Resolution:
    """`placement.visible.resolve` for these facts, computed once per Facts (it is pure)."""
    hit = _RESOLVED.get(id(facts))
    if hit is not None and hit[0] is facts:
        return hit[1]
    from gpuwarden.placement import visible

    res = visible.resolve(facts.snapshot, facts.environ)
    _RESOLVED.clear()  # keep one: the facts being judged now
    _RESOLVED[id(facts)] = (facts, res)
    return res


def kept_ids(res: Resolution) -> tuple[str, ...]:
    """The devices a resolution keeps, each by the one ID that names it exactly (a MIG
    instance by its own UUID): what to put back into CUDA_VISIBLE_DEVICES."""
    return tuple(d.mig_uuid or d.uuid for d in res.devices)


def gpu_label(gpu: Gpu) -> str:
    cc = (
        f", sm_{gpu.compute_capability[0]}{gpu.compute_capability[1]}"
        if gpu.compute_capability
        else ""
    )
    return f"GPU {gpu.index} ({gpu.name or 'unknown model'}{cc})"


def capabilities(facts: Facts) -> tuple[tuple[int, int], ...]:
    return tuple(
        sorted({g.compute_capability for g in facts.snapshot.gpus if g.compute_capability})
    )


def torch_release(facts: Facts) -> Optional[tuple[int, ...]]:
    return cuda_compat.parse_version(facts.torch.version)


def install_fix(facts: Facts, wheel: Optional[cuda_compat.WheelBuild] = None) -> str:
    """The pip line for the best official CUDA build for this driver and these GPUs."""
    snap = facts.snapshot
    if wheel is None:
        wheel = cuda_compat.best_wheel(
            snap.cuda_driver_version,
            capabilities(facts),
            torch_release(facts),
            snap.driver_version,
        )
    if wheel is None:
        need = cuda_compat.MINOR_COMPAT_MIN_DRIVER[12]
        have = snap.cuda_driver_version
        return (
            f"update the NVIDIA driver (>= {need} for CUDA 12 builds; this one supports CUDA "
            f"{cuda_compat.fmt_cuda(have) if have else '?'})"
            ", then install a CUDA build of torch (https://pytorch.org/get-started/locally/)"
        )
    return cuda_compat.install_command(wheel.variant, facts.torch.version)
