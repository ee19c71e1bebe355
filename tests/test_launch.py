"""The job's environment and torchrun command line (no process started)."""

from __future__ import annotations

import sys

import pytest

from gpuwarden.base.errors import UserError
from gpuwarden.jobs.launch import ddp_argv, job_env
from gpuwarden.machine.inventory import Gpu
from gpuwarden.placement.visible import allowed_uuids

G = [Gpu(index=3, uuid="GPU-3"), Gpu(index=5, uuid="GPU-5")]


def test_job_env_replaces_an_enclosing_lease() -> None:
    base = {"PATH": "/bin", "GPUWARDEN_MEM_LIMIT": "1", "GPUWARDEN_JOB": "old"}
    env = job_env(base, G, job="j1")
    assert env["CUDA_VISIBLE_DEVICES"] == "3,5"
    assert env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
    assert env["GPUWARDEN_GPUS"] == "GPU-3,GPU-5"
    assert env["GPUWARDEN_JOB"] == "j1"
    assert "GPUWARDEN_MEM_LIMIT" not in env
    assert env["PATH"] == "/bin"
    assert job_env(base, G, use_uuid=True)["CUDA_VISIBLE_DEVICES"] == "GPU-3,GPU-5"
    shared = job_env({}, G[:1], job="j", mem=2**30)
    assert shared["GPUWARDEN_MEM_LIMIT"] == str(2**30)
    assert shared["GPUWARDEN_LEASE"] == "shared"
    assert job_env({}, ())["CUDA_VISIBLE_DEVICES"] == ""


@pytest.mark.parametrize(
    ("cmd", "tail"),
    [
        (["train.py", "--lr", "1"], ["train.py", "--lr", "1"]),
        (["python", "train.py", "-x"], ["train.py", "-x"]),
        (["python3", "-m", "pkg.train", "a"], ["-m", "pkg.train", "a"]),
        (["./trainer", "a"], ["--no-python", "./trainer", "a"]),
        (["python", "trainer"], ["trainer"]),  # a script without .py is still a script
    ],
)
def test_ddp_argv(cmd: list[str], tail: list[str], tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.py").touch()
    (tmp_path / "trainer").touch(mode=0o755)
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").touch()
    argv = ddp_argv(cmd, 4, python="/py")
    assert argv[:5] == ["/py", "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=4"]
    assert argv[5:] == tail


def test_ddp_runs_under_the_interpreter_of_the_command(tmp_path, monkeypatch) -> None:
    # A student's venv has torch; the lab install's own Python has none: torchrun is
    # the one of the interpreter the command names, or of the script's `#!` line.
    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.py").write_text("print(1)\n")
    venv = str(tmp_path / "venv" / "bin" / "python")
    head = ["-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2"]
    assert ddp_argv([venv, "train.py", "-x"], 2) == [venv, *head, "train.py", "-x"]
    assert ddp_argv(["python3", "train.py"], 2)[:2] == ["python3", "-m"]
    (tmp_path / "env.py").write_text("#!/usr/bin/env python3\nprint(1)\n")
    assert ddp_argv(["env.py"], 2) == ["python3", *head, "env.py"]
    (tmp_path / "own.py").write_text(f"#!{venv}\n")
    assert ddp_argv(["own.py", "a"], 2) == [venv, *head, "own.py", "a"]
    (tmp_path / "opts.py").write_text("#!/usr/bin/python3 -u\n")  # options: not ours to pass
    assert ddp_argv(["opts.py"], 2, python="/py")[0] == "/py"
    assert ddp_argv([venv, "train.py"], 2, python="/py")[0] == "/py"


def test_ddp_argv_bad_input(tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "t.py").touch()
    with pytest.raises(UserError, match="no script"):
        ddp_argv([], 2)
    with pytest.raises(UserError, match="no script"):
        ddp_argv([""], 2)
    with pytest.raises(UserError, match="no script"):
        ddp_argv(["python"], 2)
    with pytest.raises(UserError, match="interpreter option"):
        ddp_argv(["python", "-u", "train.py"], 2)
    assert ddp_argv([sys.executable, "t.py"], 1)[-1] == "t.py"


@pytest.mark.parametrize(
    ("cmd", "message"),
    [
        (["missing.py"], "--ddp: script not found: missing.py"),
        (["python", "sub"], "--ddp: script not found: sub"),
        (["adir.py"], "--ddp: script is not a file: adir.py"),
        (["-m", "no_such_module_here.train"], "--ddp: no module named"),
        (["./no-such-program"], "command not found: ./no-such-program"),
    ],
)
def test_ddp_argv_refuses_a_missing_target(cmd, message, tmp_path, monkeypatch) -> None:
    # torchrun would start every rank and print a traceback for each instead.
    monkeypatch.chdir(tmp_path)
    (tmp_path / "adir.py").mkdir()
    with pytest.raises(UserError, match=message) as err:
        ddp_argv(cmd, 2)
    assert err.value.exit_code == 127


def test_allowed_uuids_follow_the_parent_environment() -> None:
    from gpuwarden.machine.inventory import Snapshot

    snap = Snapshot(0.0, "h", gpus=tuple(Gpu(index=i, uuid=f"GPU-{i}{i}") for i in range(4)))
    env = {"CUDA_DEVICE_ORDER": "PCI_BUS_ID"}
    assert allowed_uuids(snap, env) is None
    assert allowed_uuids(snap, dict(env, CUDA_VISIBLE_DEVICES="2,0")) == ("GPU-22", "GPU-00")
    assert allowed_uuids(snap, dict(env, CUDA_VISIBLE_DEVICES="")) == ()
    with pytest.raises(UserError, match="CUDA_VISIBLE_DEVICES"):
        allowed_uuids(snap, dict(env, CUDA_VISIBLE_DEVICES="1,1"))


@pytest.mark.slow
@pytest.mark.usefixtures("torch_installed")
def test_ddp_on_cpu_starts_one_process_per_rank(cli, tmp_path) -> None:
    script = tmp_path / "train.py"
    script.write_text(
        "import os\n"
        f"open({str(tmp_path)!r} + '/rank' + os.environ['RANK'], 'w').write(\n"
        "    os.environ['WORLD_SIZE'] + ' ' + os.environ['GPUWARDEN_DDP_BACKEND']\n"
        "    + ' [' + os.environ['CUDA_VISIBLE_DEVICES'] + ']')\n"
    )
    r = cli("run", "--ddp", "--cpu", "--nproc", "2", "--", str(script), timeout=120)
    assert r.returncode == 0, r.stderr
    for rank in (0, 1):
        assert (tmp_path / f"rank{rank}").read_text() == "2 gloo []"


def test_a_mig_device_is_exported_and_allowed_by_its_mig_uuid() -> None:
    from gpuwarden.jobs.launch import export_value
    from gpuwarden.machine.inventory import MigInstance, Snapshot

    mig = Gpu(index=3, uuid="MIG-44d5e7c7-29e5", name="A100 MIG 2g.20gb")
    assert export_value([G[0], mig]) == "3,MIG-44d5e7c7-29e5"  # never "3,3"
    assert export_value([mig], use_uuid=True) == "MIG-44d5e7c7-29e5"
    parent = Gpu(
        index=0,
        uuid="GPU-aa",
        mig_mode=True,
        mig_instances=(MigInstance("MIG-11", 0), MigInstance("MIG-22", 1)),
    )
    snap = Snapshot(0.0, "h", gpus=(parent,))
    assert allowed_uuids(snap, {"CUDA_VISIBLE_DEVICES": "MIG-22"}) == ("MIG-22",)


def test_ddp_without_torch_is_one_line_not_a_traceback_per_rank(tmp_path, monkeypatch) -> None:
    """Issue 23: `run --ddp` where the Python has no torch printed Python's raw
    "Error while finding module specification for 'torch.distributed.run'"."""
    import importlib.machinery

    from gpuwarden.jobs.launch import LaunchError

    script = tmp_path / "train.py"
    script.write_text("")
    real = importlib.machinery.PathFinder.find_spec

    def without_torch(name, *rest):  # type: ignore[no-untyped-def]
        return None if name == "torch" else real(name, *rest)

    monkeypatch.setattr(importlib.machinery.PathFinder, "find_spec", without_torch)
    with pytest.raises(LaunchError, match=r"--ddp starts the job with torchrun.*has no torch"):
        ddp_argv([str(script)], 2)
    assert ddp_argv([str(script)], 2, python="/other/python")[0] == "/other/python"
