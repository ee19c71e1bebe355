"""What the tests of a real Slurm share: whether one can run here, and its ports."""

from __future__ import annotations

import contextlib
import os
import shutil
import socket


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


def free_port_pair() -> int:
    """A free port whose next one is free too (slurmctld and slurmd listen side by side)."""
    for _ in range(100):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port > 60000:
            continue
        with contextlib.suppress(OSError), socket.socket() as t:
            t.bind(("127.0.0.1", port + 1))
            return port
    raise RuntimeError("no two free ports in a row")
