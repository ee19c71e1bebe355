"""NVIDIA's compatibility rules and PyTorch's published wheel builds, as data plus pure functions.

Two questions decide whether a CUDA build of PyTorch can run on a machine,
and both are answerable without initialising CUDA:

1. Can the driver run the CUDA runtime torch was built with?  A driver runs
   every toolkit up to the CUDA version it reports (backward compatibility);
   a newer *minor* of the same major also runs through minor-version
   compatibility when the driver is at least the major's minimum, but PTX
   compiled by the newer toolkit cannot be JIT-compiled by the older driver.
   A newer *major* never runs ("the NVIDIA driver on your system is too old").

2. Does the build carry code for the GPU?  A cubin `sm_XY` runs on compute
   capability X.Z for Z >= Y (same major only); PTX `compute_XY` is JIT-compiled
   by the driver for any capability >= X.Y. Architecture-specific targets
   (`sm_90a`) run only on exactly that capability; family targets (`sm_100f`)
   on the same major with a minor >= theirs. No match means "no kernel image
   is available for execution on the device" at the first kernel launch.

Sources (checked when the tables were written; update them together):
- Driver minimums for minor-version compatibility and per-toolkit minimum
  drivers: NVIDIA, "CUDA Compatibility" (docs.nvidia.com/deploy/cuda-compatibility)
  and the CUDA Toolkit release notes, table "CUDA Toolkit and Corresponding
  Driver Versions" (Linux x86_64 values).
- Wheel architecture lists: pytorch/pytorch `.ci/manywheel/build_cuda.sh`
  (12.6: 5.0;6.0;7.0;7.5;8.0;8.6;9.0, 12.8: 7.0;...;10.0;12.0, 12.9: ...;12.0+PTX),
  pytorch/builder `manywheel/build_cuda.sh` (11.8: 3.7;5.0;6.0;7.0;7.5;8.0;8.6;9.0),
  pytorch/pytorch RELEASE.md "PyTorch CUDA Support Matrix" (2.9-2.11: 13.0 is
  7.5;8.0;8.6;9.0;10.0;12.0+PTX; from 2.11 cu128 drops 7.0) and pytorch/pytorch
  issues #157517, #172352 and #182250 (`get_arch_list()` of 2.10/2.11 cu126/cu128).
  Linux x86_64 wheels; Windows builds carry no PTX.
"""

from __future__ import annotations

import re
from typing import Optional

from gpuwarden.base.records import record

WHEEL_INDEX = "https://download.pytorch.org/whl/"

# CUDA major -> the oldest Linux driver that runs any toolkit of that major
# through minor-version compatibility.
MINOR_COMPAT_MIN_DRIVER: dict[int, str] = {11: "450.80.02", 12: "525.60.13", 13: "580.65.06"}

# CUDA (major, minor) -> the Linux driver released with that toolkit: at or
# above it, the toolkit runs with no minor-version caveats.
TOOLKIT_DRIVER: dict[tuple[int, int], str] = {
    (11, 0): "450.36.06",
    (11, 1): "455.23",
    (11, 2): "460.27.03",
    (11, 3): "465.19.01",
    (11, 4): "470.42.01",
    (11, 5): "495.29.05",
    (11, 6): "510.39.01",
    (11, 7): "515.43.04",
    (11, 8): "520.61.05",
    (12, 0): "525.60.13",
    (12, 1): "530.30.02",
    (12, 2): "535.54.03",
    (12, 3): "545.23.06",
    (12, 4): "550.54.14",
    (12, 5): "555.42.02",
    (12, 6): "560.28.03",
    (12, 8): "570.26",
    (12, 9): "575.51.03",
    (13, 0): "580.65.06",
}


@record
class WheelBuild:
    """One official `download.pytorch.org/whl/<variant>` build family.

    `first`/`last` bound the torch releases (major, minor) this arch list
    applies to; `last=None` means "still published".
    """

    variant: str  # "cu126"
    cuda: tuple[int, int]
    archs: tuple[str, ...]
    first: tuple[int, int]
    last: Optional[tuple[int, int]] = None


_SM50_TO_90 = ("sm_50", "sm_60", "sm_70", "sm_75", "sm_80", "sm_86", "sm_90")

WHEELS: tuple[WheelBuild, ...] = (
    WheelBuild("cu118", (11, 8), ("sm_37", *_SM50_TO_90), (2, 0), (2, 0)),
    WheelBuild("cu118", (11, 8), _SM50_TO_90, (2, 1), (2, 7)),
    WheelBuild("cu121", (12, 1), _SM50_TO_90, (2, 1), (2, 5)),
    WheelBuild("cu124", (12, 4), _SM50_TO_90, (2, 4), (2, 6)),
    WheelBuild("cu126", (12, 6), _SM50_TO_90, (2, 6)),
    WheelBuild(
        "cu128",
        (12, 8),
        ("sm_75", "sm_80", "sm_86", "sm_90", "sm_100", "sm_120", "compute_120"),
        (2, 7),
        (2, 7),
    ),
    WheelBuild(
        "cu128",
        (12, 8),
        ("sm_70", "sm_75", "sm_80", "sm_86", "sm_90", "sm_100", "sm_120"),
        (2, 8),
        (2, 10),
    ),
    WheelBuild("cu128", (12, 8), ("sm_75", "sm_80", "sm_86", "sm_90", "sm_100", "sm_120"), (2, 11)),
    WheelBuild(
        "cu129",
        (12, 9),
        ("sm_70", "sm_75", "sm_80", "sm_86", "sm_90", "sm_100", "sm_120", "compute_120"),
        (2, 8),
        (2, 10),
    ),
    WheelBuild(
        "cu130",
        (13, 0),
        ("sm_75", "sm_80", "sm_86", "sm_90", "sm_100", "sm_120", "compute_120"),
        (2, 9),
    ),
)

_ARCH = re.compile(r"^(sm|compute)_(\d+?)(\d)([af]?)$")


def parse_version(text: Optional[str]) -> Optional[tuple[int, ...]]:
    """'550.54.15' -> (550, 54, 15); '2.6.0+cu126' -> (2, 6, 0); None when unreadable."""
    if not text:
        return None
    parts = []
    for piece in re.split(r"[.+]", text.strip()):
        m = re.match(r"\d+", piece)
        if not m:
            break
        parts.append(int(m.group()))
    return tuple(parts) or None


def cuda_tuple(text: Optional[str]) -> Optional[tuple[int, int]]:
    """'12.6' -> (12, 6)."""
    v = parse_version(text)
    if not v:
        return None
    return (v[0], v[1] if len(v) > 1 else 0)


def fmt_cuda(v: tuple[int, int]) -> str:
    return f"{v[0]}.{v[1]}"


def parse_arch(arch: str) -> Optional[tuple[str, tuple[int, int], str]]:
    """'sm_86' -> ('sm', (8, 6), ''); 'compute_90a' -> ('compute', (9, 0), 'a')."""
    m = _ARCH.match(arch.strip().lower())
    if not m:
        return None
    return m.group(1), (int(m.group(2)), int(m.group(3))), m.group(4)


def arch_runs_on(arch: str, cc: tuple[int, int]) -> Optional[str]:
    """How code for `arch` runs on capability `cc`: 'cubin', 'ptx' or None."""
    parsed = parse_arch(arch)
    if parsed is None:
        return None
    kind, target, suffix = parsed
    if suffix == "a":
        ok = cc == target
    elif kind == "sm" or suffix == "f":
        ok = cc[0] == target[0] and cc[1] >= target[1]
    else:
        ok = cc >= target
    if not ok:
        return None
    return "cubin" if kind == "sm" else "ptx"


def kernel_support(archs: tuple[str, ...], cc: tuple[int, int]) -> Optional[str]:
    """'cubin' when a cubin runs natively, 'ptx' when only PTX JIT would, None when nothing."""
    ways = {arch_runs_on(a, cc) for a in archs}
    if "cubin" in ways:
        return "cubin"
    if "ptx" in ways:
        return "ptx"
    return None


def wheels_for(torch_version: Optional[tuple[int, ...]]) -> tuple[WheelBuild, ...]:
    """The wheel builds published for that torch release; the newest per variant when unknown."""
    if torch_version is None or len(torch_version) < 2:
        latest: dict[str, WheelBuild] = {}
        for w in WHEELS:
            latest[w.variant] = w
        return tuple(latest.values())
    tv = (torch_version[0], torch_version[1])
    found = [w for w in WHEELS if w.first <= tv and (w.last is None or tv <= w.last)]
    if found:
        return tuple(found)
    if tv > max(w.first for w in WHEELS):
        # A torch newer than this table: assume the still-published builds carry on.
        return tuple(w for w in WHEELS if w.last is None)
    return ()


def wheel_archs(variant: str, torch_version: Optional[tuple[int, ...]]) -> Optional[WheelBuild]:
    """The official build of `variant` for that torch release, if the table knows it."""
    return next((w for w in wheels_for(torch_version) if w.variant == variant), None)


def variant_of(torch_version_text: Optional[str], cuda: Optional[str]) -> Optional[str]:
    """'2.6.0+cu126' -> 'cu126'; falls back to torch.version.cuda ('12.6' -> 'cu126')."""
    if torch_version_text and "+" in torch_version_text:
        local = torch_version_text.split("+", 1)[1]
        if re.fullmatch(r"cu\d{3}", local):
            return local
    c = cuda_tuple(cuda)
    return f"cu{c[0]}{c[1]}" if c else None


def wheels_supporting(
    cc: tuple[int, int], torch_version: Optional[tuple[int, ...]]
) -> tuple[WheelBuild, ...]:
    """Official builds (for that torch release, or the newest ones) with code for `cc`."""
    return tuple(w for w in wheels_for(torch_version) if kernel_support(w.archs, cc))


def driver_at_least(driver: Optional[str], minimum: str) -> Optional[bool]:
    d, m = parse_version(driver), parse_version(minimum)
    if d is None or m is None:
        return None
    return d >= m


@record
class DriverVerdict:
    """Whether the driver can run a given CUDA runtime, and why (one line)."""

    level: str  # "ok", "minor-compat", "too-old"
    reason: str


def driver_runs(
    toolkit: tuple[int, int],
    driver_cuda: Optional[tuple[int, int]],
    driver_version: Optional[str],
) -> DriverVerdict:
    """Can a driver (its CUDA version and release) run a toolkit's runtime?"""
    major_min = MINOR_COMPAT_MIN_DRIVER.get(toolkit[0])
    if driver_cuda is not None:
        if toolkit <= driver_cuda:
            return DriverVerdict(
                "ok", f"CUDA {fmt_cuda(toolkit)} <= driver's CUDA {fmt_cuda(driver_cuda)}"
            )
        if toolkit[0] > driver_cuda[0]:
            return DriverVerdict(
                "too-old",
                f"CUDA {fmt_cuda(toolkit)} needs a CUDA {toolkit[0]}.x driver"
                + (f" (>= {major_min})" if major_min else "")
                + f"; this driver supports up to CUDA {fmt_cuda(driver_cuda)}",
            )
    if major_min and driver_at_least(driver_version, major_min) is False:
        return DriverVerdict(
            "too-old",
            f"CUDA {toolkit[0]}.x needs driver >= {major_min}, found {driver_version}",
        )
    if driver_cuda is None:
        full = TOOLKIT_DRIVER.get(toolkit)
        if full and driver_at_least(driver_version, full):
            return DriverVerdict("ok", f"driver {driver_version} >= {full}")
        if driver_version is None:
            return DriverVerdict("ok", "driver's CUDA version unknown")
    shown = fmt_cuda(driver_cuda) if driver_cuda else "an older CUDA"
    return DriverVerdict(
        "minor-compat",
        f"CUDA {fmt_cuda(toolkit)} runs on a CUDA {shown} driver only through minor-version "
        f"compatibility: PTX built by CUDA {fmt_cuda(toolkit)} cannot be JIT-compiled by "
        "this driver, and features that need the newer driver fail",
    )


def best_wheel(
    driver_cuda: Optional[tuple[int, int]],
    ccs: tuple[tuple[int, int], ...],
    torch_version: Optional[tuple[int, ...]],
    driver_version: Optional[str] = None,
) -> Optional[WheelBuild]:
    """The official build to install for this driver and these GPUs.

    Preference: builds the driver runs outright (newest first), then builds it
    runs through minor-version compatibility (closest to the driver first);
    within a tier, one with code for every GPU wins. None when the driver runs none.
    """
    wheels = wheels_for(torch_version)
    if driver_cuda is None and driver_version is None:
        tiers = [sorted(wheels, key=lambda w: w.cuda, reverse=True)]
    else:
        verdicts = {w: driver_runs(w.cuda, driver_cuda, driver_version).level for w in wheels}
        tiers = [
            sorted((w for w in wheels if verdicts[w] == "ok"), key=lambda w: w.cuda, reverse=True),
            sorted((w for w in wheels if verdicts[w] == "minor-compat"), key=lambda w: w.cuda),
        ]
    for tier in tiers:
        for w in tier:
            if all(kernel_support(w.archs, cc) for cc in ccs):
                return w
    for tier in tiers:
        if tier:
            return tier[0]
    return None


def install_command(variant: str, torch_version: Optional[str]) -> str:
    """The pip line that installs torch from an official index: a replacement pinned to the
    installed release, or a plain install when there is none to replace."""
    v = parse_version(torch_version)
    if not v:
        return f"pip install torch --index-url {WHEEL_INDEX}{variant}"
    pin = "==" + ".".join(str(p) for p in v)
    return f"pip install --force-reinstall 'torch{pin}' --index-url {WHEEL_INDEX}{variant}"
