"""scripts/gpu-acceptance where there is no GPU: its no-GPU exit, its parsers, and a dry
run in which a simulated machine and a stand-in nvidia-smi play the real ones."""

from __future__ import annotations

import importlib.machinery
import importlib.util
import json
import os
import subprocess
import sys

import pytest

from acceptance import FAKE_SMI, SCRIPT, run_script


def load_script():
    loader = importlib.machinery.SourceFileLoader("gpu_acceptance", str(SCRIPT))
    spec = importlib.util.spec_from_loader("gpu_acceptance", loader)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["gpu_acceptance"] = module  # dataclasses look their module up there
    loader.exec_module(module)
    return module


ga = load_script()


def test_script_is_executable_with_a_shebang():
    assert os.access(SCRIPT, os.X_OK)
    assert SCRIPT.read_text().startswith("#!/usr/bin/env python3\n")


def test_no_nvidia_smi_means_no_gpu_exit_2(tmp_path):
    empty = tmp_path / "bin"
    empty.mkdir()
    proc = run_script(path=str(empty), out=tmp_path / "out")
    assert proc.returncode == 2
    assert "no NVIDIA GPU here" in proc.stderr and "nvidia-smi not found" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert "nothing was checked" in (tmp_path / "out" / "gpu-acceptance.log").read_text()


def test_failing_nvidia_smi_means_no_gpu_with_its_reason(tmp_path):
    bindir = tmp_path / "bin"
    bindir.mkdir()
    smi = bindir / "nvidia-smi"
    smi.write_text(
        "#!/bin/sh\necho \"NVIDIA-SMI has failed because it couldn't communicate with the "
        'NVIDIA driver."\nexit 9\n'
    )
    smi.chmod(0o755)
    proc = run_script(path=f"{bindir}:/usr/bin:/bin", out=tmp_path / "out")
    assert proc.returncode == 2
    assert "couldn't communicate with the NVIDIA driver" in proc.stderr


def test_list_names_every_area():
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--list"], capture_output=True, text=True, timeout=60
    )
    names = proc.stdout.split()
    for wanted in ("status", "visible[duplicate]", "run-wait", "torch-nccl", "exporter"):
        assert wanted in names
    assert "health" in names and "sim-vs-real" in names


def test_csv_and_numbers():
    rows = ga.parse_csv("0, GPU-a, NVIDIA H200, 143771, 4\n\n1, GPU-b, X, [N/A], 0\n")
    assert rows[0] == ["0", "GPU-a", "NVIDIA H200", "143771", "4"]
    assert ga.number(rows[1][3]) is None and ga.number("12.5") == 12.5


def test_metrics_parser():
    text = (
        "# HELP gpuwarden_gpu_power_watts Power draw\n"
        'gpuwarden_gpu_power_watts{gpu="0",uuid="GPU-a",model="H200"} 612.5\n'
        'gpuwarden_gpu_info{gpu="1",model="a \\"quoted\\" name"} 1.0\n'
        "process_cpu_seconds_total 3.0\n"
    )
    metrics = ga.parse_metrics(text)
    assert metrics["gpuwarden_gpu_power_watts"] == [
        ({"gpu": "0", "uuid": "GPU-a", "model": "H200"}, 612.5)
    ]
    assert metrics["process_cpu_seconds_total"] == [({}, 3.0)]
    assert metrics["gpuwarden_gpu_info"][0][0]["gpu"] == "1"


def sample(used_bytes: float, util: float, temp: float, power: float, smi: list[str]):
    labels = {"gpu": "0", "uuid": "GPU-a"}
    metrics = {
        "gpuwarden_gpu_memory_used_bytes": [(labels, used_bytes)],
        "gpuwarden_gpu_utilization_ratio": [(labels, util)],
        "gpuwarden_gpu_temperature_celsius": [(labels, temp)],
        "gpuwarden_gpu_power_watts": [(labels, power)],
    }
    return metrics, [["0", "GPU-a", *smi]]


def test_exporter_comparison_takes_the_closest_pair_and_flags_real_gaps():
    good = [
        sample(1000 * ga.MIB, 0.50, 40, 300, ["1500", "90", "41", "500"]),
        sample(1010 * ga.MIB, 0.88, 41, 495, ["1012", "90", "41", "505"]),
    ]
    assert "4 readings agree" in ga.compare_exporter(good)
    bad = [sample(1000 * ga.MIB, 0.9, 41, 500, ["4000", "90", "60", "500"])]
    with pytest.raises(ga.Fail) as err:
        ga.compare_exporter(bad)
    assert "memory_used" in str(err.value) and "temperature" in str(err.value)
    assert "power" not in str(err.value)


def test_power_within_ten_percent_passes_on_big_cards():
    big = [sample(0, 1.0, 50, 640, ["0", "100", "50", "690"])]
    assert "agree" in ga.compare_exporter(big)


def test_uuid_helpers():
    raw = bytes.fromhex("c9c6dc4430cb524393009e68e223f168")
    assert ga.uuid_from_bytes(raw) == "GPU-c9c6dc44-30cb-5243-9300-9e68e223f168"
    assert ga.bare_uuid("GPU-C9C6") == "c9c6" and ga.bare_uuid("MIG-ab") == "ab"


def test_expected_precision():
    assert ga.expected_precision((9, 0)) == "bf16"
    assert ga.expected_precision((8, 6)) == "bf16"
    assert ga.expected_precision((7, 5)) == "fp16"
    assert ga.expected_precision((6, 1)) == "fp32"


def test_visible_cases_cover_every_rule():
    one = {label: (v, o) for label, v, o in ga.visible_values(["GPU-aaaa-1111"])}
    assert one["unset"] == (None, None) and one["empty"] == ("", None)
    assert one["out of range"][0] == "1" and one["out of range then duplicate"][0] == "0,1,0"
    assert one["uuid prefix"][0] == "GPU-aaaa-111"
    for rule in ("plus sign", "junk after digits", "spaces", "negative", "duplicate"):
        assert rule in one
    two = [label for label, _, _ in ga.visible_values(["GPU-a", "GPU-b"])]
    assert "reversed" in two and "uuid then index" in two


def test_pick_walks_nested_keys():
    assert ga.pick({"memory": {"used": 5}}, "memory_used", "memory.used") == 5
    assert ga.pick({"memory_used": 0}, "memory_used", "memory.used") == 0
    assert ga.pick({}, "a", "b.c") is None


@pytest.mark.slow
def test_dry_run_on_the_simulated_h200(tmp_path):
    bindir = tmp_path / "bin"
    bindir.mkdir()
    smi = bindir / "nvidia-smi"
    smi.write_text(FAKE_SMI.format(python=sys.executable))
    smi.chmod(0o755)
    env = {"GPU_ACCEPTANCE_SIM": "h200", "GPUWARDEN_SIM": "h200"}
    out = tmp_path / "out"
    proc = run_script(
        "--only",
        "status,visible[unset],health,sim-vs-real",
        path=f"{bindir}:{os.environ['PATH']}",
        env=env,
        out=out,
    )
    lines = {ln.split()[1]: ln.split()[0] for ln in proc.stdout.splitlines() if ln[:4].strip()}
    assert lines.get("status") == "PASS", proc.stdout + proc.stderr
    assert lines.get("sim-vs-real") == "PASS", proc.stdout
    assert lines.get("health") in ("PASS", "SKIP"), proc.stdout
    # torch here is a CPU build and there is no libcuda: those say so instead of passing
    assert lines.get("environment") == "FAIL"
    assert lines.get("visible[unset]") in ("FAIL", "SKIP")
    assert "gpu-acceptance:" in proc.stdout and proc.returncode == 1
    record = json.loads((out / "gpu-acceptance.json").read_text())
    assert record["facts"]["gpus"][0]["name"] == "NVIDIA H200"
    assert {r["name"] for r in record["results"]} >= {"status", "sim-vs-real"}
