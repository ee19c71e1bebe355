"""What a Slurm job's tasks see: CUDA_VISIBLE_DEVICES naming the MIG slices it was given.

Slurm sets CUDA_VISIBLE_DEVICES from gres.conf. Where gres.conf lists the devices by
their files (`File=`, `MultipleFiles=`: `gpuwarden slurm conf`, and any Slurm built
without NVML autodetection, as Debian's is), a job on a MIG slice gets the slice's
position in gres.conf (5), which CUDA reads as a whole GPU's index and finds no device:
CUDA opens a MIG slice only by its UUID (`MIG-...`). slurmd runs `TaskProlog=` in each
task before the job's program, as the job's user, and takes the `export NAME=VALUE`
lines it prints into the task's environment; `gpuwarden slurm task-prolog` prints the
job's devices by UUID there when one of them is a slice, and nothing otherwise (for
whole GPUs Slurm's own numbers are right, renumbered from 0 under ConstrainDevices).
"""

from __future__ import annotations

import re
import sys
from collections.abc import Mapping, Sequence
from typing import Any

from gpuwarden.base.errors import UserError

_UUID = re.compile(r"(GPU|MIG)-[A-Za-z0-9/-]{1,120}")


def job_positions(environ: Mapping[str, str]) -> list[int]:
    """The positions in gres.conf of what this task's step was given: SLURM_STEP_GPUS
    for an `srun` step, else the job's SLURM_JOB_GPUS (the batch script's step)."""
    from gpuwarden.slurm.prolog import job_gpus

    step = environ.get("SLURM_STEP_GPUS", "").strip()
    return job_gpus({"SLURM_JOB_GPUS": step} if step else environ)


def visible(devices: Sequence[Any]) -> str:
    """CUDA_VISIBLE_DEVICES for `devices` (pure): their UUIDs, in Slurm's order, when
    one is a MIG slice; '' when none is (Slurm's value stands)."""
    from gpuwarden.placement import mig

    if not any(mig.is_mig(d) for d in devices):
        return ""
    for d in devices:
        if not _UUID.fullmatch(str(d.uuid)):
            raise UserError(f"GPU {d.index}: NVML gave {d.uuid!r}, not a GPU or MIG UUID")
    return ",".join(str(d.uuid) for d in devices)


def task_prolog(environ: Mapping[str, str]) -> list[str]:
    """The lines TaskProlog= prints: `export CUDA_VISIBLE_DEVICES=MIG-...` when the job
    has a slice. A position gres.conf's order does not explain is an error (UserError),
    as in the prolog."""
    positions = job_positions(environ)
    if not positions:
        return []
    from gpuwarden.machine.inventory import read_snapshot
    from gpuwarden.slurm.prolog import slurm_devices

    units = slurm_devices(read_snapshot(processes=False))
    if max(positions) >= len(units):
        raise UserError(
            f"GPU {max(positions)} of the job is not on this machine ({len(units)} in "
            "gres.conf's order); is gres.conf `gpuwarden slurm conf`'s?"
        )
    value = visible([units[i] for i in positions])
    return [f"export CUDA_VISIBLE_DEVICES={value}"] if value else []


def main(environ: Mapping[str, str]) -> int:
    """`gpuwarden slurm task-prolog`: never fails the task (slurmd would kill it);
    what went wrong is one line on the task's stderr, and Slurm's value stands."""
    try:
        lines = task_prolog(environ)
    except UserError as err:
        print(
            f"gpuwarden slurm task-prolog: {err}; CUDA_VISIBLE_DEVICES left as Slurm set it",
            file=sys.stderr,
        )
        return 0
    for line in lines:
        print(line)
    return 0
