"""gpustat and nvitop, unmodified, see the simulated machine exactly as gpuwarden does."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from gpuwarden.sim.fake import SHIM_DIR

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent


def _env() -> dict[str, str]:
    return dict(
        os.environ,
        GPUWARDEN_SIM="server-8xa100",
        PYTHONPATH=f"{SHIM_DIR}{os.pathsep}{ROOT / 'src'}",
        COLUMNS="120",
    )


def _tool(name: str) -> Path:
    path = BIN / name
    if not path.exists():
        if os.environ.get("GPUWARDEN_REQUIRE_COMPONENTS"):
            pytest.fail(f"{name} is not installed in {BIN}")
        pytest.skip(f"{name} is not installed")
    return path


def _ours() -> list[dict]:
    out = subprocess.run(
        [sys.executable, "-m", "gpuwarden", "status", "--json"],
        env=_env(),
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(out.stdout)["gpus"]


def test_gpustat_json_agrees():
    out = subprocess.run(
        [str(_tool("gpustat")), "--json"], env=_env(), capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    theirs = json.loads(out.stdout)["gpus"]
    ours = _ours()
    assert len(theirs) == len(ours) == 8
    for a, b in zip(ours, theirs):
        assert b["uuid"] == a["uuid"]
        assert b["memory.total"] == a["memory_total"] // 2**20
        assert b["memory.used"] == a["memory_used"] // 2**20
        assert b["utilization.gpu"] == a["utilization_gpu"]
        assert b["temperature.gpu"] == a["temperature"]


_SIZE = r"([\d.]+)(MiB|GiB|B|KiB)"


def _mib(value: str, unit: str) -> float:
    return float(value) * {"B": 2**-20, "KiB": 2**-10, "MiB": 1, "GiB": 1024}[unit]


def test_nvitop_once_agrees():
    out = subprocess.run(
        [str(_tool("nvitop")), "-1"], env=_env(), capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    assert "ERROR" not in out.stdout + out.stderr
    rows = re.findall(rf"│\s*{_SIZE} / {_SIZE}\s*│\s*(\d+)%", out.stdout)
    ours = _ours()
    assert len(rows) == len(ours) == 8
    for gpu, (used, uu, total, tu, util) in zip(ours, rows):
        assert _mib(total, tu) == pytest.approx(gpu["memory_total"] / 2**20, abs=0.01 * 1024)
        assert _mib(used, uu) == pytest.approx(gpu["memory_used"] / 2**20, abs=0.01 * 1024)
        assert int(util) == gpu["utilization_gpu"]
    # the processes table lists every simulated process with its memory
    assert out.stdout.count("71.00GiB") >= 4
