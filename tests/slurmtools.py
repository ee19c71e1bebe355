"""What the tests of a real Slurm share: whether one can run here."""

from __future__ import annotations

import os
import shutil


def missing() -> str:
    """Why a test Slurm cannot run here, or "" when it can."""
    for tool in ("slurmctld", "slurmd", "sbatch", "squeue", "munged"):
        if shutil.which(tool) is None and not os.path.exists(f"/usr/sbin/{tool}"):
            return f"Slurm is not installed ({tool} missing; scripts/slurm-ci install)"
    if os.geteuid() != 0:
        return "a test Slurm needs root (slurmd runs jobs as their users)"
    if not os.path.exists("/etc/munge/munge.key"):
        return "munge has no key (/etc/munge/munge.key)"
    return ""
