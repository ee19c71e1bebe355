"""`gpuwarden status`: the table, the versioned JSON, CUDA marks, no-driver and bad input."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

SRC = Path(__file__).resolve().parent.parent / "src"


def test_table_shows_every_gpu_with_processes_and_health(sim, cli):
    sim("server-8xa100")
    out = cli("status")
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert "550.54.15" in lines[0] and "12.4" in lines[0]
    rows = [ln for ln in lines if ln.lstrip()[:1].isdigit()]
    assert len(rows) == 8
    assert "alice(71.0GiB)" in rows[0] and "71.0GiB / 80.0GiB" in rows[0]
    assert "remap-pending" in rows[6]
    assert "carol(30.0GiB)" in rows[5]


def test_json_schema_1(sim, cli):
    sim("server-8xa100")
    out = cli("status", "--json")
    data = json.loads(out.stdout)
    assert data["schema"] == 1 and data["source"] == "sim:server-8xa100"
    assert data["cuda_driver_version"] == "12.4"
    g = data["gpus"][0]
    assert g["memory_total"] == 81920 * 2**20 and g["compute_capability"] == "8.0"
    assert g["processes"][0]["user"] == "alice"
    assert g["health"]["level"] == "ok" and g["drain"] is None and g["leases"] == []
    assert data["gpus"][6]["health"]["findings"][0]["code"] == "remap-pending"


def test_cuda_visible_devices_marks_cuda_indices(sim, cli):
    sim("server-8xa100")
    env = {"CUDA_VISIBLE_DEVICES": "5,2", "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}
    data = json.loads(cli("status", "--json", env=env).stdout)
    assert {g["index"]: g["cuda_index"] for g in data["gpus"] if g["cuda_index"] is not None} == {
        5: 0,
        2: 1,
    }
    text = cli("status", env=env).stdout
    row5 = next(ln for ln in text.splitlines() if ln.startswith("  5"))
    assert row5.split()[1] == "0"


def test_no_driver_one_line_exit_0(sim, cli):
    sim("laptop-none")
    out = cli("status")
    assert out.returncode == 0
    assert out.stdout.strip() == "no NVIDIA driver found (libnvidia-ml.so.1 not loadable); CPU only"
    data = json.loads(cli("status", "--json").stdout)
    assert data["gpus"] == [] and "no NVIDIA driver" in data["error"]


def test_unknown_spec_is_one_line(cli):
    out = cli("--sim", "nope", "status")
    assert out.returncode != 0 and "Traceback" not in out.stderr
    assert out.stderr.count("\n") == 1 and "server-8xa100" in out.stderr


def test_lost_gpu_shown(sim, cli):
    sim("server-8xa100")
    assert cli("sim", "inject", "lose", "--gpu", "3").returncode == 0
    text = cli("status").stdout
    row = next(ln for ln in text.splitlines() if ln.startswith("  3"))
    assert "LOST" in row and "n/a" in row


def test_occupy_shows_up_and_goes_away(sim, cli):
    sim("workstation-3x3090")
    env = dict(os.environ, PYTHONPATH=str(SRC))
    sleep = [sys.executable, "-c", "import time; time.sleep(30)"]
    args = ["sim", "occupy", "--gpu", "2", "--mem", "8GiB", "--util", "40", "--user", "zoe"]
    occupy = subprocess.Popen(
        [sys.executable, "-m", "gpuwarden", *args, "--", *sleep],
        env=env,
    )
    try:
        deadline = time.time() + 20
        while time.time() < deadline:
            gpu = json.loads(cli("status", "--json").stdout)["gpus"][2]
            if gpu["processes"]:
                break
            time.sleep(0.2)
        assert gpu["processes"][0]["user"] == "zoe"
        assert gpu["memory_used"] == 8 * 2**30 and gpu["utilization_gpu"] == 40
    finally:
        occupy.send_signal(signal.SIGINT)
        occupy.wait(timeout=20)
    gpu = json.loads(cli("status", "--json").stdout)["gpus"][2]
    assert gpu["processes"] == [] and gpu["memory_used"] == 0


def test_watch_refreshes_and_ctrl_c_exits_0(sim):
    sim("workstation-3x3090")
    env = dict(os.environ, PYTHONPATH=str(SRC))
    proc = subprocess.Popen(
        [sys.executable, "-m", "gpuwarden", "status", "--watch", "0.2"],
        env=env,
        stdout=subprocess.PIPE,
        text=True,
    )
    time.sleep(1.5)
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=10)
    assert proc.returncode == 0
    assert out.count("\x1b[H\x1b[2J") >= 2 and "RTX 3090" in out


def test_watch_rejects_nonpositive(sim, cli):
    sim("workstation-3x3090")
    out = cli("status", "--watch", "0")
    assert out.returncode == 2 and "positive" in out.stderr


def test_one_shot_commands_pause_the_collector_and_give_it_back():
    import gc

    from gpuwarden.cli.oneshot import one_shot

    assert gc.isenabled()
    frozen = gc.get_freeze_count()
    try:
        with one_shot():
            assert not gc.isenabled()
            kept = [[i] for i in range(1000)]
        assert gc.isenabled() and gc.get_freeze_count() >= frozen + len(kept)
        gc.disable()
        with one_shot():
            pass
        assert not gc.isenabled()  # a caller's choice is kept
    finally:
        gc.enable()
        gc.unfreeze()
