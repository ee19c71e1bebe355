"""gpuwarden.torch's policies as pure functions: launcher detection, precision, placement.

None of these import torch, so they run in milliseconds and cover every branch.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from gpuwarden.base.errors import UserError
from gpuwarden.torch import environments as envs
from gpuwarden.torch.amp import decide
from gpuwarden.torch.devices import cuda_index, pick_type, requested
from gpuwarden.torch.distributed import choose_backend
from gpuwarden.torch.memory import fraction, limit_bytes

TORCHRUN = {
    "RANK": "3",
    "LOCAL_RANK": "1",
    "WORLD_SIZE": "4",
    "LOCAL_WORLD_SIZE": "2",
    "MASTER_ADDR": "10.0.0.1",
    "MASTER_PORT": "29400",
    "TORCHELASTIC_RUN_ID": "none",
}
SLURM = {
    "SLURM_PROCID": "5",
    "SLURM_LOCALID": "1",
    "SLURM_NTASKS": "8",
    "SLURM_STEP_ID": "0",
    "SLURM_NODEID": "2",
    "SLURM_TASKS_PER_NODE": "2(x4)",
    "SLURM_JOB_NODELIST": "node[01-04],gpu7",
    "SLURM_JOB_ID": "123456",
}


def test_torchrun_variables_are_read() -> None:
    got = envs.detect(TORCHRUN)
    assert got == envs.Launch("torchelastic", 3, 1, 4, 2, "10.0.0.1", 29400)
    assert got.distributed


def test_torchrun_wins_over_slurm_inside_an_allocation() -> None:
    assert envs.detect({**SLURM, **TORCHRUN}).environment == "torchelastic"


def test_slurm_master_is_first_host_and_port_follows_job_id() -> None:
    got = envs.detect(SLURM)
    assert (got.environment, got.rank, got.local_rank, got.world_size) == ("slurm", 5, 1, 8)
    assert got.local_world_size == 2
    assert got.master_addr == "node01"
    assert got.master_port == 15000 + 123456 % 20000


def test_slurm_batch_shell_without_srun_is_single_process() -> None:
    batch = {k: v for k, v in SLURM.items() if k != "SLURM_STEP_ID"}
    assert envs.detect(batch).environment == "single"


def test_open_mpi_and_pmi() -> None:
    ompi = {
        "OMPI_COMM_WORLD_RANK": "1",
        "OMPI_COMM_WORLD_SIZE": "2",
        "OMPI_COMM_WORLD_LOCAL_RANK": "1",
        "OMPI_COMM_WORLD_LOCAL_SIZE": "2",
    }
    got = envs.detect(ompi)
    assert (got.environment, got.rank, got.world_size, got.master_addr) == (
        "mpi",
        1,
        2,
        "127.0.0.1",  # one node: loopback is right
    )
    pmi = {"PMI_RANK": "0", "PMI_SIZE": "4", "MPI_LOCALRANKID": "0", "MPI_LOCALNRANKS": "4"}
    assert envs.detect(pmi).world_size == 4


def test_single_process() -> None:
    got = envs.detect({})
    assert got == envs.Launch("single", 0, 0, 1, 1, "127.0.0.1", 29500)
    assert not got.distributed


@pytest.mark.parametrize(
    ("environ", "says"),
    [
        ({"RANK": "4", "WORLD_SIZE": "4"}, "outside world size 4"),
        ({"RANK": "0", "WORLD_SIZE": "0"}, "at least 1"),
        ({"RANK": "x", "WORLD_SIZE": "2"}, "not a whole number"),
        ({"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "2", "LOCAL_WORLD_SIZE": "2"}, "local"),
        (
            {"RANK": "0", "WORLD_SIZE": "8", "LOCAL_WORLD_SIZE": "4"},
            "MASTER_ADDR is not set",
        ),
        ({"RANK": "0", "WORLD_SIZE": "1", "MASTER_PORT": "70000"}, "not a TCP port"),
        (
            {"OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": "4"}
            | {"OMPI_COMM_WORLD_LOCAL_SIZE": "2"},
            "MASTER_ADDR",
        ),
        ({**SLURM, "SLURM_JOB_NODELIST": "node[01-"}, "unbalanced"),
        ({**SLURM, "SLURM_PROCID": "8"}, "outside world size 8"),
    ],
)
def test_inconsistent_variables_are_one_clear_error(environ: dict, says: str) -> None:
    with pytest.raises(UserError, match=says.replace("[", r"\[")):
        envs.detect(environ)


@pytest.mark.parametrize(
    ("nodelist", "hosts"),
    [
        ("node[01-04],gpu7", ["node01", "node02", "node03", "node04", "gpu7"]),
        ("a1", ["a1"]),
        ("n[1,3-4]", ["n1", "n3", "n4"]),
        ("r[1-2]-n[08-09]", ["r1-n08", "r1-n09", "r2-n08", "r2-n09"]),
        ("gpu[007-009].cluster", ["gpu007.cluster", "gpu008.cluster", "gpu009.cluster"]),
    ],
)
def test_nodelist_expansion(nodelist: str, hosts: list[str]) -> None:
    assert envs.expand_nodelist(nodelist) == hosts
    assert envs.first_host(nodelist) == hosts[0]


@pytest.mark.parametrize("bad", ["n[1-", "n[a-b]", "n[5-2]", "a,,b", "n]1["])
def test_bad_nodelist(bad: str) -> None:
    with pytest.raises(UserError):
        envs.expand_nodelist(bad)


def test_tasks_per_node() -> None:
    assert [envs.tasks_on_node("2(x3),1", n) for n in range(4)] == [2, 2, 2, 1]
    with pytest.raises(UserError):
        envs.tasks_on_node("2(x3)", 3)


@pytest.mark.parametrize(
    ("device", "cc", "asked", "expected"),
    [
        ("cuda", (9, 0), "auto", ("bf16", False)),
        ("cuda", (8, 0), "auto", ("bf16", False)),
        ("cuda", (8, 6), "fp16", ("fp16", True)),
        ("cuda", (7, 5), "auto", ("fp16", True)),
        ("cuda", (7, 0), "auto", ("fp16", True)),
        ("cuda", (6, 1), "auto", ("fp32", False)),
        ("cuda", (6, 1), "fp16", ("fp16", True)),
        ("cuda", (9, 0), "fp32", ("fp32", False)),
        ("cpu", None, "auto", ("fp32", False)),
        ("cpu", None, "bf16", ("bf16", False)),
        ("cpu", None, "fp16", ("fp16", True)),
        ("cpu", None, "FP32", ("fp32", False)),
        ("mps", None, "auto", ("fp32", False)),
        ("mps", None, "fp16", ("fp16", True)),
    ],
)
def test_precision_policy(device: str, cc: tuple | None, asked: str, expected: tuple) -> None:
    made = decide(device, cc, asked)
    assert (made.name, made.scaler) == expected
    assert made.device_type == device


def test_precision_refuses_bf16_on_volta_and_unknown_requests() -> None:
    with pytest.raises(UserError, match=r"8\.0 or newer; this GPU is 7\.0"):
        decide("cuda", (7, 0), "bf16")
    with pytest.raises(UserError, match="choose one of"):
        decide("cpu", None, "fp8")


def test_device_type_policy() -> None:
    assert pick_type("auto", 2, True) == "cuda"
    assert pick_type("auto", 0, True) == "mps"
    assert pick_type("auto", 0, False) == "cpu"
    assert pick_type("cpu", 8, True) == "cpu"
    with pytest.raises(UserError, match="no CUDA GPU is visible"):
        pick_type("cuda", 0, False)
    with pytest.raises(UserError, match="mps"):
        pick_type("mps", 0, False)


def test_cuda_index_per_local_rank() -> None:
    assert cuda_index(3, 4) == 3
    assert cuda_index(3, 1) == 0  # the launcher bound one GPU to this task
    with pytest.raises(UserError, match="local rank 4 has no GPU: only 4"):
        cuda_index(4, 4)


def test_requested_device_from_env_and_bad_value() -> None:
    assert requested({"GPUWARDEN_DEVICE": "CPU"}) == "cpu"
    assert requested({}) == "auto"
    with pytest.raises(UserError, match="GPUWARDEN_DEVICE='gpu'"):
        requested({"GPUWARDEN_DEVICE": "gpu"})


def test_backend_choice() -> None:
    assert choose_backend("cuda") == "nccl"
    assert choose_backend("cuda", windows=True) == "gloo"
    assert choose_backend("cpu") == "gloo"
    assert choose_backend("mps") == "gloo"


def test_memory_limit() -> None:
    assert limit_bytes({}) is None
    assert limit_bytes({"GPUWARDEN_MEM_LIMIT": "2000"}) == 2000
    assert limit_bytes({"GPUWARDEN_MEM_LIMIT": "20GiB"}) == 20 * 2**30
    with pytest.raises(UserError, match="GPUWARDEN_MEM_LIMIT"):
        limit_bytes({"GPUWARDEN_MEM_LIMIT": "10XB"})
    with pytest.raises(UserError, match="more than 0"):
        limit_bytes({"GPUWARDEN_MEM_LIMIT": "0"})
    assert fraction(20 * 2**30, 80 * 2**30) == 0.25
    assert fraction(100, 50) == 1.0


def test_importing_the_package_does_not_import_torch() -> None:
    code = "import sys, gpuwarden.torch; assert 'torch' not in sys.modules, 'torch imported'"
    subprocess.run([sys.executable, "-c", code], check=True)
