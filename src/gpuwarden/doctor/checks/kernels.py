"""Predict "no kernel image is available for execution on the device" before it happens.

Each GPU's compute capability (from NVML, so CUDA is never initialised)
against the architectures torch was compiled for, with CUDA's rules (see
`cuda_compat`).
"""

from __future__ import annotations

from gpuwarden.doctor import cuda_compat
from gpuwarden.doctor.checks.common import gpu_label, torch_release
from gpuwarden.doctor.facts import Facts
from gpuwarden.doctor.findings import FAIL, INFO, PASS, SKIP, WARN, Finding

NAME = "kernels"


def check_kernels(facts: Facts) -> list[Finding]:
    t, snap = facts.torch, facts.snapshot
    if not t.installed:
        return [Finding(NAME, SKIP, "torch is not installed", t.skipped)]
    if not t.cuda:
        return [Finding(NAME, SKIP, "torch has no CUDA kernels to match against GPUs")]
    if not snap.gpus:
        return [Finding(NAME, SKIP, "no NVIDIA GPUs to match torch's kernels against")]
    if t.arch_list is None:
        return [
            Finding(
                NAME,
                SKIP,
                "torch's compiled architectures are unknown (not an official wheel, and torch "
                "was not asked)",
                f"torch {t.version}",
                "run `gpuwarden doctor` without --no-torch-import",
            )
        ]
    archs = t.arch_list
    shipped = " ".join(archs) or "none"
    source = f"torch {t.version} ships: {shipped} ({t.arch_source or 'torch'})"
    release = torch_release(facts)
    found, native = [], []
    toolkit = cuda_compat.cuda_tuple(t.cuda)
    driver_cuda = snap.cuda_driver_version
    for gpu in snap.gpus:
        cc = gpu.compute_capability
        if cc is None:
            found.append(
                Finding(NAME, INFO, f"{gpu_label(gpu)}: compute capability unknown", gpu=gpu.uuid)
            )
            continue
        sm = f"sm_{cc[0]}{cc[1]}"
        support = cuda_compat.kernel_support(archs, cc)
        if support == "cubin":
            native.append(gpu)
            continue
        if support == "ptx":
            newer_ptx = toolkit is not None and driver_cuda is not None and toolkit > driver_cuda
            found.append(
                Finding(
                    NAME,
                    FAIL if newer_ptx else WARN,
                    f"{gpu_label(gpu)}: no {sm} cubin, only PTX"
                    + (
                        f" from CUDA {t.cuda}, which this CUDA "
                        f"{cuda_compat.fmt_cuda(driver_cuda)} driver cannot JIT-compile"
                        if newer_ptx and driver_cuda
                        else ": kernels are JIT-compiled on first use (slow start)"
                    ),
                    source,
                    _fix(facts, cc, release),
                    gpu.uuid,
                )
            )
            continue
        found.append(
            Finding(
                NAME,
                FAIL,
                f'{gpu_label(gpu)}: "no kernel image is available for execution on the '
                f'device" - this torch has no code for {sm}',
                source,
                _fix(facts, cc, release),
                gpu.uuid,
            )
        )
    if native:
        models = sorted(
            {
                f"{g.name or '?'} sm_{g.compute_capability[0]}{g.compute_capability[1]}"
                for g in native
                if g.compute_capability
            }
        )
        found.insert(
            0,
            Finding(
                NAME,
                PASS,
                f"{len(native)} GPU(s) have native kernels in this torch: {', '.join(models)}",
                source,
            ),
        )
    return found


def _fix(facts: Facts, cc: tuple[int, int], release: object) -> str:
    version = cuda_compat.parse_version(facts.torch.version)
    sm = f"sm_{cc[0]}{cc[1]}"
    wheels = cuda_compat.wheels_supporting(cc, version)
    where = f"torch {facts.torch.version}"
    if not wheels:
        version = None
        wheels = cuda_compat.wheels_supporting(cc, None)
        where = "current torch releases"
    if not wheels:
        return (
            f"no official wheel has code for {sm}: build PyTorch from source with "
            f"TORCH_CUDA_ARCH_LIST={cc[0]}.{cc[1]}, or use an older torch release"
        )
    names = ", ".join(sorted({w.variant for w in wheels}))
    snap = facts.snapshot
    pick = cuda_compat.best_wheel(snap.cuda_driver_version, (cc,), version, snap.driver_version)
    note = ""
    if pick is None or not cuda_compat.kernel_support(pick.archs, cc):
        pick = max(wheels, key=lambda w: w.cuda)
        need = cuda_compat.TOOLKIT_DRIVER.get(pick.cuda, "a newer one")
        note = f" (after updating the NVIDIA driver to >= {need})"
    line = cuda_compat.install_command(pick.variant, facts.torch.version if version else None)
    return f"builds of {where} with {sm} code: {names}; {line}{note}"
