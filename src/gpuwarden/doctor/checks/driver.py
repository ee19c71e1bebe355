"""Driver checks: is NVML there, which driver, and can it run torch's CUDA runtime."""

from __future__ import annotations

from gpuwarden.doctor import cuda_compat
from gpuwarden.doctor.checks.common import install_fix
from gpuwarden.doctor.facts import Facts
from gpuwarden.doctor.findings import FAIL, INFO, PASS, SKIP, WARN, Finding

DRIVER_DOWNLOAD = "https://www.nvidia.com/Download/index.aspx"


def check_driver(facts: Facts) -> list[Finding]:
    snap = facts.snapshot
    if snap.driver_version is None and not snap.gpus:
        if facts.platform == "darwin":
            return [Finding("driver", INFO, "macOS: no NVIDIA driver (use MPS on Apple silicon)")]
        saw = snap.error or "NVML reports no GPUs"
        if snap.error:
            level = WARN if facts.torch.cuda else INFO
            return [
                Finding(
                    "driver",
                    level,
                    "no NVIDIA driver answered (NVML not loadable)",
                    saw=saw,
                    fix="if this machine has an NVIDIA GPU (`lspci | grep -i nvidia`), install "
                    f"the driver ({DRIVER_DOWNLOAD}) and check `nvidia-smi`",
                )
            ]
        return [Finding("driver", INFO, "no NVIDIA GPUs on this machine", saw=saw)]
    cuda = cuda_compat.fmt_cuda(snap.cuda_driver_version) if snap.cuda_driver_version else "n/a"
    saw = (
        f"driver {snap.driver_version or 'n/a'}, CUDA {cuda}, NVML {snap.nvml_version or 'n/a'}, "
        f"{len(snap.gpus)} GPU(s)"
    )
    oldest = cuda_compat.MINOR_COMPAT_MIN_DRIVER[11]
    if cuda_compat.driver_at_least(snap.driver_version, oldest) is False:
        return [
            Finding(
                "driver",
                WARN,
                f"driver {snap.driver_version} is older than any current PyTorch CUDA build needs",
                saw=saw,
                fix=f"update the NVIDIA driver to >= {cuda_compat.MINOR_COMPAT_MIN_DRIVER[12]} "
                f"({DRIVER_DOWNLOAD})",
            )
        ]
    return [
        Finding(
            "driver",
            PASS,
            f"NVIDIA driver {snap.driver_version or 'n/a'} (supports up to CUDA {cuda})",
            saw=saw,
        )
    ]


def check_driver_toolkit(facts: Facts) -> list[Finding]:
    """torch's CUDA runtime against the driver, with NVIDIA's compatibility rules."""
    t, snap = facts.torch, facts.snapshot
    name = "driver.toolkit"
    if not t.installed:
        return [Finding(name, SKIP, "torch is not installed", saw=t.skipped)]
    toolkit = cuda_compat.cuda_tuple(t.cuda)
    if toolkit is None:
        return [Finding(name, SKIP, "torch has no CUDA runtime to match against the driver")]
    if snap.driver_version is None and snap.cuda_driver_version is None:
        return [Finding(name, SKIP, "no NVIDIA driver to match torch's CUDA against")]
    verdict = cuda_compat.driver_runs(toolkit, snap.cuda_driver_version, snap.driver_version)
    saw = f"torch {t.version} built with CUDA {t.cuda}; driver {snap.driver_version or 'n/a'}: " + (
        verdict.reason
    )
    full = cuda_compat.TOOLKIT_DRIVER.get(toolkit)
    update = f"update the NVIDIA driver to >= {full}" if full else "update the NVIDIA driver"
    if verdict.level == "ok":
        return [Finding(name, PASS, f"the driver runs torch's CUDA {t.cuda}", saw=saw)]
    if verdict.level == "minor-compat":
        return [
            Finding(
                name,
                WARN,
                f"torch's CUDA {t.cuda} is newer than the driver's; it runs through "
                "minor-version compatibility only",
                saw=saw,
                fix=f"{update}, or install a build matching the driver: {install_fix(facts)}",
            )
        ]
    return [
        Finding(
            name,
            FAIL,
            f"the driver is too old for torch's CUDA {t.cuda}: "
            "torch.cuda.is_available() will be False",
            saw=saw,
            fix=f"{update}, or install a build the driver runs: {install_fix(facts)}",
        )
    ]
