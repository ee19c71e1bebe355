"""Where `run`, `select` and `lease()` place a job on the simulated server, as a user sees it.

The spec `server-8xa100`: GPUs 0-3 run alice's jobs (71 GiB each), GPU 4 bob's 12 GiB
job, GPU 5 carol's two processes, GPU 6 is idle with a pending row remap (a health
warning), GPU 7 is idle and healthy.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import gpuwarden.leases as lease
from gpuwarden.health import xidlog
from gpuwarden.machine.inventory import read_snapshot


def _uuids() -> list[str]:
    return [g.uuid for g in read_snapshot(processes=False).gpus]


def _visible(tmp_path: Path, result) -> str:
    assert result.returncode == 0, result.stderr
    return json.loads((tmp_path / "env.json").read_text())["CUDA_VISIBLE_DEVICES"]


def _job(tmp_path: Path) -> list[str]:
    out = tmp_path / "env.json"
    return [
        sys.executable,
        "-c",
        f"import json, os; json.dump(dict(os.environ), open({str(out)!r}, 'w'))",
    ]


def test_a_gpu_status_calls_fatal_is_never_handed_out(sim, cli, tmp_path: Path) -> None:
    sim("server-8xa100")
    uuids = _uuids()
    xidlog.record_xid(uuids[7], 79, index=7)  # as the health watch records it
    assert "FATAL:xid-79" in cli("status").stdout.splitlines()[9]
    out = cli("select", "-n", "1", "--explain", "-q")
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "6"  # the idle GPU with only a warning
    assert f"GPU 7 {uuids[7]}: unhealthy: XID 79" in out.stderr
    assert _visible(tmp_path, cli("run", "-g", "1", "--", *_job(tmp_path))) == "6"
    dry = cli("run", "--gpus", "7", "--dry-run", "--", "true")
    assert dry.returncode == 2 and "GPU 7: unhealthy: XID 79" in dry.stdout
    # A drain and its undrain leave the recorded XID in force.
    assert cli("drain", "7", "--reason", "xid").returncode == 0
    assert cli("undrain", "7").returncode == 0
    out = cli("select", "-g", "8", "-q")
    assert out.returncode == 2, out.stdout
    assert "only 7 are healthy and not drained (GPU 7 unhealthy: XID 79" in out.stderr
    xidlog.clear_xids([uuids[7]])
    assert cli("select", "-n", "1", "-q").stdout.strip() == "7"


def test_select_accepts_g_as_run_and_reserve_do(sim, cli) -> None:
    sim("server-8xa100")
    out = cli("select", "-g", "2", "-q")
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "6,7"
    assert cli("select", "-n", "1", "-q").stdout.strip() == "7"


def test_min_free_does_not_land_on_a_colleagues_gpu(sim, cli, tmp_path: Path) -> None:
    sim("server-8xa100")
    r = cli("run", "-g", "2", "--min-free", "20GiB", "--", *_job(tmp_path))
    assert _visible(tmp_path, r) == "6,7"  # not GPU 4, where bob's 12 GiB job runs
    dry = cli("run", "-g", "2", "--min-free", "20GiB", "--dry-run", "--", "true")
    lines = dry.stdout.splitlines()
    assert lines[0].startswith("would use GPU 6") and "GPU 7" in lines[0]
    reasons = {line.split(":")[0].strip(): line.split(":", 1)[1].strip() for line in lines[2:]}
    assert set(reasons) == {f"GPU {i}" for i in range(6)}  # every GPU not chosen
    assert reasons["GPU 4"].startswith("busy: pid") and "(bob) uses 12.0GiB" in reasons["GPU 4"]
    # Asked for explicitly: a load is accepted, or the GPU is named.
    dry = cli("run", "-g", "1", "--max-util", "5", "--min-free", "20GiB", "--dry-run", "--", "x")
    assert dry.stdout.startswith("would use GPU 7")
    assert "GPU 4: not needed" in dry.stdout
    assert cli("run", "--gpus", "4", "--dry-run", "--", "x").stdout.startswith("would use GPU 4")
    # With the idle GPUs leased, the refusal says how to accept a busy one.
    r = cli("run", "-g", "3", "--min-free", "20GiB", "--", "true")
    assert r.returncode == 75
    assert "busy: pid" in r.stderr and "--max-util or --gpus accepts them" in r.stderr


def test_lease_in_python_follows_the_same_rule(sim) -> None:
    sim("server-8xa100")
    import gpuwarden

    with gpuwarden.lease(n=2, min_free="20GiB") as gpus:
        assert sorted(g.index for g in gpus) == [6, 7]
    assert lease.list_leases() == []


def test_an_empty_command_name_is_one_clear_line(sim, cli) -> None:
    sim("server-8xa100")
    for args in (("-g", "1"), ("--cpu",)):
        r = cli("run", *args, "--", "")
        assert r.returncode == 127, r.stderr
        assert (
            r.stderr.strip() == "gpuwarden run: command not found: '' (the command name is empty)"
        )
    assert lease.list_leases() == []


def test_ddp_with_a_missing_script_is_one_clear_line(sim, cli) -> None:
    sim("server-8xa100")
    for args in (("--cpu", "--nproc", "2"), ("-g", "1")):
        r = cli("run", "--ddp", *args, "--", "nosuch.py", "--epochs", "3")
        assert r.returncode == 127, r.stderr
        assert r.stderr.strip() == "gpuwarden run: --ddp: script not found: nosuch.py"
    assert lease.list_leases() == []


# --- MIG, on the `mixed` spec: GPU 3 is an A100 in MIG mode with four MIG devices;
# grace computes in the first (3g.40gb), heidi in the third (1g.10gb).
MIG_IDLE_20GB = "MIG-44d5e7c7-29e5-5224-b9a1-2b9b2e5ed9e6"
MIG_GRACE = "MIG-4d8bf2db-7c15-5609-9823-3ee2cb6e1304"
MIG_IDLE_10GB = "MIG-a519e028-12b6-5f0e-b6eb-f2727e12e20a"


def test_a_parent_mig_device_is_passed_on_as_itself(sim, cli, tmp_path: Path) -> None:
    # Not `3`: CUDA would read that as the A100, and give its first MIG device (grace's).
    sim("mixed")
    parent = {"CUDA_VISIBLE_DEVICES": MIG_IDLE_20GB}
    r = cli("run", "--", *_job(tmp_path), env=parent)
    assert _visible(tmp_path, r) == MIG_IDLE_20GB
    out = cli("visible", env={"CUDA_VISIBLE_DEVICES": MIG_IDLE_20GB})
    assert MIG_IDLE_20GB in out.stdout and MIG_GRACE not in out.stdout
    # A prefix in the parent, and a request that cannot fit in what the parent sees.
    r = cli("run", "--", *_job(tmp_path), env={"CUDA_VISIBLE_DEVICES": MIG_IDLE_20GB[:12]})
    assert _visible(tmp_path, r) == MIG_IDLE_20GB
    r = cli("run", "--", "true", env={"CUDA_VISIBLE_DEVICES": MIG_GRACE})
    assert r.returncode == 75 and "(grace)" in r.stderr
    r = cli("select", "-q", env=parent)
    assert r.stdout.strip() == MIG_IDLE_20GB


def test_mig_devices_are_named_chosen_and_filtered_like_gpus(sim, cli) -> None:
    sim("mixed")
    out = cli("run", "--gpus", MIG_IDLE_10GB[:10], "--dry-run", "--", "x")
    assert out.returncode == 0, out.stderr
    assert f"CUDA_VISIBLE_DEVICES={MIG_IDLE_10GB}" in out.stdout
    out = cli("run", "--gpus", "3", "--", "true")
    assert out.returncode == 2 and "GPU 3 is in MIG mode" in out.stderr
    assert MIG_IDLE_10GB in out.stderr
    out = cli("run", "--exclude", "3", "--max-util", "100", "--dry-run", "--", "x")
    assert f"GPU 3 {MIG_IDLE_20GB}: excluded" in out.stdout
    # NVML reads no utilization per MIG device: at most 100% still passes.
    out = cli("select", "--max-util", "100", "--gpus", MIG_GRACE, "-q")
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == MIG_GRACE
    out = cli("select", "--max-util", "50", "--gpus", MIG_GRACE, "-q")
    assert out.returncode == 75 and "NVML gives none per MIG device" in out.stderr
    # An idle MIG device is the one a plain `run` gets (every GPU here is busy or broken).
    out = cli("run", "--dry-run", "--", "x")
    assert f"CUDA_VISIBLE_DEVICES={MIG_IDLE_20GB}" in out.stdout
    assert f"GPU 3 {MIG_GRACE}: busy: pid" in out.stdout
    out = cli("run", "-g", "2", "--max-util", "100", "--dry-run", "--", "x")
    assert f"GPU 3 {MIG_IDLE_20GB}: MIG device: CUDA shows a process one MIG device only" in (
        out.stdout
    )


def test_a_mig_device_is_leased_by_its_own_uuid(sim, cli, tmp_path: Path) -> None:
    sim("mixed")
    first = cli("run", "--", *_job(tmp_path))
    assert _visible(tmp_path, first) == MIG_IDLE_20GB
    with gpuwarden_lease(MIG_IDLE_20GB):
        r = cli("run", "--", *_job(tmp_path))
        assert _visible(tmp_path, r) == MIG_IDLE_10GB  # the next idle MIG device


def gpuwarden_lease(ids: str):
    import gpuwarden

    return gpuwarden.lease(gpus=ids)


def test_a_mig_gpu_is_drained_whole_and_its_devices_follow(sim, cli) -> None:
    # drain names physical GPUs; the drain then keeps every MIG device of it from jobs.
    sim("mixed")
    out = cli("drain", "3", "--reason", "maintenance")
    assert out.returncode == 0, out.stderr
    out = cli("run", "--dry-run", "--", "x")
    assert out.returncode == 75  # GPUs 0 and 2 are only busy
    assert f"GPU 3 {MIG_IDLE_20GB}: drained by" in out.stdout
    assert cli("undrain", "3").returncode == 0
    assert f"CUDA_VISIBLE_DEVICES={MIG_IDLE_20GB}" in cli("run", "--dry-run", "--", "x").stdout
