"""`gpuwarden doctor` as a real process on simulated machines, plus how facts are gathered."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from gpuwarden.doctor import facts, fingerprint
from gpuwarden.doctor.facts import (
    NO_TORCH_ENV,
    Facts,
    TorchBuild,
    find_torch,
    probe_result,
    table_archs,
)
from gpuwarden.machine.inventory import Gpu, Snapshot

ROOT = Path(__file__).resolve().parent.parent


def findings(out: str) -> list[dict]:
    return json.loads(out)["findings"]


def levels(found: list[dict], check: str) -> set[str]:
    return {f["level"] for f in found if f["check"] == check}


@pytest.mark.usefixtures("torch_installed")
def test_mixed_with_cpu_torch_names_the_machines_real_problems(cli, sim):
    sim("mixed")
    proc = cli("doctor", "--json")
    assert proc.returncode == 1, proc.stderr
    doc = json.loads(proc.stdout)
    found = doc["findings"]
    assert doc["exit_code"] == 1
    # The installed CPU torch, asked through the child probe: a CPU build on a GPU box.
    cpu = [f for f in found if f["check"] == "torch.build" and f["level"] == "FAIL"]
    assert cpu and "CPU-only" in cpu[0]["title"] and "4 NVIDIA GPU" in cpu[0]["title"]
    # driver 535 (CUDA 12.2): the closest build it runs for this torch release.
    assert "download.pytorch.org/whl/cu126" in cpu[0]["fix"]
    assert doc["facts"]["torch"]["arch_list"] == []  # from torch itself, not the table
    # The V100 with uncorrected ECC errors.
    ecc = [f for f in found if f["check"] == "machine.health" and "ECC" in f["title"]]
    assert ecc and all(f["level"] == "FAIL" for f in ecc) and "V100" in ecc[0]["title"]
    # Four generations and no PCI_BUS_ID.
    order = [f for f in found if f["check"] == "visible" and "PCI_BUS_ID" in f["fix"]]
    assert order and order[0]["level"] == "WARN"
    assert levels(found, "distributed.backend") == {"INFO"}  # CPU build: gloo


@pytest.mark.usefixtures("torch_installed")
def test_mixed_text_output_and_pci_bus_id_clears_the_order_warning(cli, sim):
    sim("mixed")
    proc = cli("doctor", "--no-torch-import")
    assert proc.returncode == 1
    assert "FAIL  torch.build" in proc.stdout and "whl/cu126" in proc.stdout
    assert "summary:" in proc.stdout and "-> exit 1" in proc.stdout
    fixed = cli("doctor", "--json", "--no-torch-import", env={"CUDA_DEVICE_ORDER": "PCI_BUS_ID"})
    assert not [f for f in findings(fixed.stdout) if "PCI_BUS_ID" in f["fix"]]


@pytest.mark.usefixtures("torch_installed")
def test_laptop_without_gpus_exits_zero(cli, sim):
    sim("laptop-none")
    proc = cli("doctor", "--json", "--no-torch-import")
    assert proc.returncode == 0, proc.stdout
    found = findings(proc.stdout)
    assert levels(found, "driver") == {"INFO"}
    assert levels(found, "torch.build") == {"PASS"}
    assert levels(found, "kernels") == {"SKIP"}
    assert not [f for f in found if f["level"] == "FAIL"]


def test_without_torch_torch_checks_skip(cli, sim):
    sim("server-8xa100")
    proc = cli("doctor", "--json", env={NO_TORCH_ENV: "1"})
    found = findings(proc.stdout)
    assert levels(found, "torch.build") == {"SKIP"}
    assert levels(found, "kernels") == {"SKIP"}
    assert proc.returncode == 0, proc.stdout  # a healthy server, nothing FAILs
    assert json.loads(proc.stdout)["facts"]["torch"]["installed"] is False


def test_distributed_env_and_visible_errors_reach_the_cli(cli, sim):
    sim("server-8xa100")
    proc = cli(
        "doctor",
        "--json",
        "--no-torch-import",
        env={"CUDA_VISIBLE_DEVICES": "0,0", "MASTER_ADDR": "10.1.1.1"},
    )
    found = findings(proc.stdout)
    assert proc.returncode == 1
    assert "FAIL" in levels(found, "visible")
    assert "FAIL" in levels(found, "distributed")


@pytest.mark.parametrize("name", ["env.json", "env.txt"])
def test_export_fingerprint_by_extension(cli, sim, tmp_path, name, request):
    if name.endswith(".json"):  # it names the installed torch
        request.getfixturevalue("torch_installed")
    sim("mixed")
    out = tmp_path / name
    proc = cli("doctor", "--export", str(out), "--no-torch-import", env={"HF_TOKEN_SECRET": "x"})
    assert proc.returncode == 0, proc.stderr
    body = out.read_text()
    if name.endswith(".json"):
        data = json.loads(body)
        assert len(data["gpus"]) == 4 and all(g["uuid"].startswith("GPU-") for g in data["gpus"])
        assert data["driver"]["version"] == "535.183.01"
        assert data["torch"]["version"] == "2.13.0+cpu"
        assert any(line.startswith("psutil==") for line in data["pip_freeze"])
        assert data["environment"]["GPUWARDEN_SIM"] == "mixed"
    else:
        assert "[pip freeze]" in body and "[gpus]" in body and "535.183.01" in body
        assert "V100" in body
    assert "HF_TOKEN" not in body  # not a relevant variable, and secret-looking anyway


def test_export_to_unwritable_path_is_one_line(cli, sim, tmp_path):
    sim("laptop-none")
    proc = cli("doctor", "--export", str(tmp_path / "no" / "such" / "dir.json"))
    assert proc.returncode != 0
    assert proc.stderr.startswith("gpuwarden doctor: cannot write")
    assert "Traceback" not in proc.stderr


@pytest.mark.usefixtures("torch_installed")
def test_in_process_warns_when_variable_changes_after_torch_import(tmp_path, sim):
    sim("server-8xa100")
    script = textwrap.dedent(
        """
        import os, sys
        import torch
        os.environ["CUDA_VISIBLE_DEVICES"] = "1"
        from gpuwarden.doctor import check
        report = check(print_report=False)
        for f in report.findings:
            if f.check == "in-process":
                print(f.level, f.title)
        """
    )
    import os

    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"))
    proc = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("WARN") and "after torch was imported" in proc.stdout


def test_in_process_before_torch_import_passes(sim):
    sim("server-8xa100")
    import os

    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"), CUDA_VISIBLE_DEVICES="2")
    script = (
        "from gpuwarden.doctor import check; r = check(print_report=False);"
        "print([f.level for f in r.findings if f.check == 'in-process'])"
    )
    proc = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=60
    )
    assert proc.stdout.strip() == "['PASS']", proc.stderr


# -- facts ------------------------------------------------------------------------------


def fake_torch(root: Path, version_py: str) -> Path:
    pkg = root / "torch"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("raise ImportError('importing this torch is a test failure')")
    (pkg / "version.py").write_text(version_py)
    return pkg


def test_find_torch_reads_version_file_without_importing(tmp_path, monkeypatch):
    fake_torch(
        tmp_path,
        "from typing import Optional\n__version__ = '2.6.0+cu126'\ndebug = False\n"
        "cuda: Optional[str] = '12.6'\ngit_version = 'abc'\nhip: Optional[str] = None\n",
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    # find_spec answers from sys.modules once torch is imported (another test may
    # have done so); hide it for this call only, nothing imports it again.
    monkeypatch.delitem(sys.modules, "torch", raising=False)
    build = find_torch({})
    assert build.installed and build.version == "2.6.0+cu126" and build.cuda == "12.6"
    assert build.hip is None  # and its __init__ (which raises) never ran
    filled = table_archs(build)
    assert "sm_90" in filled.arch_list and "sm_120" not in filled.arch_list
    assert filled.arch_source == "official cu126 wheel table"
    assert not find_torch({NO_TORCH_ENV: "1"}).installed


def test_gather_uses_the_probe_the_cli_started_and_stops_an_unwanted_one(
    tmp_path, monkeypatch, sim
):
    sim("server-8xa100")
    fake_torch(tmp_path, "__version__ = '2.6.0+cu126'\ncuda = '12.6'\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "torch", raising=False)
    monkeypatch.setattr(facts, "start_probe", None)  # gather must not start one itself
    answer = json.dumps({"version": "2.6.0+cu126", "arch_list": ["sm_80"], "nccl": True})
    early = subprocess.Popen(
        [sys.executable, "-c", f"print({answer!r})"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    got = facts.gather(environ={}, probe=early)
    assert got.torch.arch_list == ("sm_80",) and got.torch.arch_source == "torch"
    assert got.torch.nccl is True
    sleeper = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(60)"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    got = facts.gather(environ={NO_TORCH_ENV: "1"}, probe=sleeper)
    assert not got.torch.installed and sleeper.returncode is not None


def test_unknown_build_keeps_arch_list_unknown():
    build = TorchBuild(installed=True, version="2.7.0a0+gitdeadbee", cuda="12.2")
    assert table_archs(build).arch_list is None  # cu122 is no official build


def test_probe_result_merges_and_reports_errors():
    base = TorchBuild(installed=True, version="2.6.0+cu126", cuda="12.6")
    merged = probe_result(
        base,
        {"arch_list": ["sm_80", "sm_90"], "nccl": True, "cudnn": 90100, "errors": ["mps: boom"]},
    )
    assert merged.arch_list == ("sm_80", "sm_90") and merged.arch_source == "torch"
    assert merged.nccl is True and merged.cudnn == 90100 and "boom" in (merged.error or "")
    failed = probe_result(base, {"error": "import torch failed: OSError: libcudart"})
    assert failed.arch_list is None and "libcudart" in (failed.error or "")


def test_fingerprint_conda_and_secrets(tmp_path):
    meta = tmp_path / "conda-meta"
    meta.mkdir()
    (meta / "numpy-1.26.4-py311.json").write_text(
        json.dumps({"name": "numpy", "version": "1.26.4", "build": "py311h64a7726_0"})
    )
    (meta / "history").write_text("")
    assert fingerprint.conda_export(str(tmp_path)) == ["numpy=1.26.4=py311h64a7726_0"]
    env = {"CUDA_VISIBLE_DEVICES": "0", "NCCL_API_KEY": "s3cret", "HOME": "/root"}
    assert fingerprint.relevant_environ(env) == {
        "CUDA_VISIBLE_DEVICES": "0",
        "NCCL_API_KEY": "<hidden>",
    }
    facts = Facts(
        snapshot=Snapshot(taken_at=0, hostname="h", gpus=(Gpu(index=0, uuid="GPU-1"),)),
        environ={"CONDA_PREFIX": str(tmp_path)},
    )
    data = fingerprint.collect(facts)
    assert data["gpus"][0]["uuid"] == "GPU-1"
    text = fingerprint.render_text(data)
    assert "numpy=1.26.4=py311h64a7726_0" in text and "[torch]\nnot installed" in text
