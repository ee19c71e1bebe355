"""`gpuwarden slurm task-prolog`: a job on a MIG slice sees the slice's UUID in
CUDA_VISIBLE_DEVICES (CUDA opens a slice by nothing else), on the simulated `mixed`
machine (T4, V100, RTX A6000, then an A100 as 3g.40gb, 2g.20gb, 1g.10gb x2: gres.conf
positions 0-2 whole GPUs, 3-6 slices). tests/test_slurm_real.py runs it under slurmd.
"""

from __future__ import annotations

from typing import Any

import pytest

from gpuwarden.base.errors import UserError
from gpuwarden.slurm import taskenv


def _units() -> list[Any]:
    from gpuwarden.machine.inventory import read_snapshot
    from gpuwarden.slurm.prolog import slurm_devices

    return slurm_devices(read_snapshot(processes=False))


def test_a_slice_is_named_by_its_uuid_and_whole_gpus_keep_slurms_numbers(sim: Any) -> None:
    sim("mixed")
    units = _units()
    assert taskenv.task_prolog({"SLURM_JOB_GPUS": "5"}) == [
        f"export CUDA_VISIBLE_DEVICES={units[5].uuid}"
    ]
    assert units[5].uuid.startswith("MIG-")
    # a whole GPU beside a slice: both by UUID, in Slurm's order
    assert taskenv.task_prolog({"SLURM_JOB_GPUS": "0,3"}) == [
        f"export CUDA_VISIBLE_DEVICES={units[0].uuid},{units[3].uuid}"
    ]
    assert taskenv.task_prolog({"SLURM_JOB_GPUS": "0-2"}) == []  # whole GPUs only
    assert taskenv.task_prolog({}) == []  # no GPUs


def test_an_srun_step_sees_its_own_slices(sim: Any) -> None:
    sim("mixed")
    units = _units()
    environ = {"SLURM_JOB_GPUS": "4,5", "SLURM_STEP_GPUS": "5"}
    assert taskenv.task_prolog(environ) == [f"export CUDA_VISIBLE_DEVICES={units[5].uuid}"]


def test_a_position_beyond_gres_conf_is_one_line_and_never_fails_the_task(
    sim: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    sim("mixed")
    with pytest.raises(UserError, match="GPU 9 of the job is not on this machine"):
        taskenv.task_prolog({"SLURM_JOB_GPUS": "9"})
    assert taskenv.main({"SLURM_JOB_GPUS": "9"}) == 0
    out, err = capsys.readouterr()
    assert out == ""
    assert len(err.splitlines()) == 1 and "left as Slurm set it" in err
    assert taskenv.main({"SLURM_JOB_GPUS": "x"}) == 0


def test_a_uuid_that_is_not_one_is_refused_rather_than_exported() -> None:
    from gpuwarden.machine.inventory import Gpu

    bad = Gpu(index=3, uuid="MIG-x\nexport LD_PRELOAD=/tmp/evil.so")
    with pytest.raises(UserError, match="not a GPU or MIG UUID"):
        taskenv.visible([bad])
    assert taskenv.visible([Gpu(index=0, uuid="GPU-1")]) == ""
