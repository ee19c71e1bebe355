"""Is torch installed, and is it the right kind of build for this machine?"""

from __future__ import annotations

from gpuwarden.doctor.checks.common import install_fix
from gpuwarden.doctor.facts import Facts
from gpuwarden.doctor.findings import FAIL, INFO, PASS, SKIP, WARN, Finding

NAME = "torch.build"


def check_torch_build(facts: Facts) -> list[Finding]:
    t, gpus = facts.torch, facts.snapshot.gpus
    if not t.installed:
        fix = install_fix(facts) if gpus else "pip install torch"
        return [Finding(NAME, SKIP, "torch is not installed: torch checks skipped", t.skipped, fix)]
    found = []
    where = f"torch {t.version or '?'} at {t.location or '?'}"
    if t.hip:
        level = FAIL if gpus else INFO
        found.append(
            Finding(
                NAME,
                level,
                f"torch is a ROCm (AMD) build (HIP {t.hip})"
                + (f", but this machine has {len(gpus)} NVIDIA GPU(s)" if gpus else ""),
                where,
                install_fix(facts) if gpus else "",
            )
        )
    elif not t.cuda:
        if gpus:
            found.append(
                Finding(
                    NAME,
                    FAIL,
                    f"torch {t.version or ''} is a CPU-only build, but this machine has "
                    f"{len(gpus)} NVIDIA GPU(s): torch.cuda.is_available() is False",
                    where + " (torch.version.cuda is None)",
                    install_fix(facts),
                )
            )
        else:
            found.append(Finding(NAME, PASS, f"torch {t.version} (CPU-only build)", where))
    else:
        extra = []
        if t.cudnn:
            extra.append(f"cuDNN {t.cudnn}")
        if t.nccl_version:
            extra.append(f"NCCL {t.nccl_version}")
        found.append(
            Finding(
                NAME,
                PASS,
                f"torch {t.version} built with CUDA {t.cuda}",
                where + (f"; {', '.join(extra)}" if extra else ""),
            )
        )
    if t.error:
        found.append(Finding(NAME, INFO, "some facts about torch could not be read", t.error))
    if facts.platform == "darwin":
        found.extend(_mps(facts))
    return found


def _mps(facts: Facts) -> list[Finding]:
    t = facts.torch
    if facts.machine != "arm64":
        return [Finding("torch.mps", INFO, "Intel Mac: MPS needs Apple silicon")]
    if t.mps is None:
        return [Finding("torch.mps", SKIP, "MPS support unknown (torch was not asked)")]
    if not t.mps:
        return [
            Finding(
                "torch.mps",
                WARN,
                "torch is not built with MPS on an Apple-silicon Mac",
                f"torch {t.version}",
                "pip install --force-reinstall torch  (the macOS arm64 wheel from PyPI; "
                "needs an arm64 Python, not one running under Rosetta)",
            )
        ]
    return [Finding("torch.mps", PASS, "torch is built with MPS: use torch.device('mps')")]
