"""Whole-output golden tests for `gpuwarden status`: every flag combination on a
fixed simulated state, the full printed table pinned in tests/golden/status-*.txt.

A change to the table (a column, a width, a warning's words) shows up here as a
diff of the whole output, to be read and accepted on purpose:

    GPUWARDEN_REGEN_GOLDEN=1 pytest tests/test_status_golden.py

rewrites the files; review them with `git diff tests/golden`. What differs from
machine to machine is replaced before comparing: the host name, the user running
the tests (a drain's author, a lease's holder), and in JSON the times and pids.
`--watch` is not pinned: it runs until interrupted and stamps each frame with the
time; its frames are the plain table pinned here (tests/test_status.py covers it).
"""

from __future__ import annotations

import difflib
import json
import os
import pwd
import re
import socket
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

GOLDEN = Path(__file__).resolve().parent / "golden"
REGEN = os.environ.get("GPUWARDEN_REGEN_GOLDEN") == "1"

# name -> (spec, status arguments, environment, set-up): the set-up runs first
# (a drain), "job" runs status inside `gpuwarden run -g 1`, holding a lease, and
# "mig-job" inside `gpuwarden run -g 1 --mig 2g.20gb`, holding a MIG slice.
CASES: dict[str, tuple[str, tuple[str, ...], dict[str, str], str]] = {
    "server-8xa100": ("server-8xa100", (), {}, ""),
    "server-8xa100-json": ("server-8xa100", ("--json",), {}, ""),
    "mixed": ("mixed", (), {}, ""),
    "mixed-json": ("mixed", ("--json",), {}, ""),
    "mixed-visible-drained": ("mixed", (), {"CUDA_VISIBLE_DEVICES": "1,0"}, "drain"),
    "mixed-visible-drained-json": ("mixed", ("--json",), {"CUDA_VISIBLE_DEVICES": "1,0"}, "drain"),
    "mixed-pci-order": ("mixed", (), {"CUDA_DEVICE_ORDER": "PCI_BUS_ID"}, ""),
    "mixed-mig-job": ("mixed", (), {}, "mig-job"),
    "mixed-mig-job-json": ("mixed", ("--json",), {}, "mig-job"),
    "workstation-job": ("workstation-3x3090", (), {}, "job"),
    "workstation-job-json": ("workstation-3x3090", ("--json",), {}, "job"),
    "h200-sim-flag": ("", ("--sim", "h200"), {}, ""),
    "no-driver": ("laptop-none", (), {}, ""),
    "no-driver-json": ("laptop-none", ("--json",), {}, ""),
}

# Times, and the energy counter (the simulator's grows with the clock, as NVML's does).
_VOLATILE_JSON = {
    "taken_at": 0,
    "at": 0,
    "started": 0,
    "age": 0,
    "expires": 0,
    "energy_consumed": 0,
}


def _me() -> str:
    return pwd.getpwuid(os.getuid()).pw_name


def _lease_rows(text: str) -> str:
    """The lease table's JOB, PID and AGE differ per run, and the columns' widths
    with them: those cells become placeholders, cells joined by two spaces."""
    out, in_table = [], False
    for line in text.split("\n"):
        cells = re.split(r"\s{2,}", line.strip())
        if cells[:3] == ["LEASE", "USER", "JOB"]:
            in_table = True
        elif not line.strip():
            in_table = False
        elif in_table and len(cells) >= 5:
            cells[2:5] = ["<job>", "<pid>", "<age>"]
        out.append("  ".join(cells) if in_table else line)
    return "\n".join(out)


def normalize_text(text: str) -> str:
    host = socket.gethostname()
    text = _lease_rows(text)
    text = re.sub(rf"^{re.escape(host)}(?=  )", "<host>", text, flags=re.M)
    text = text.replace(sys.executable, "<python>")
    return re.sub(rf"\b{re.escape(_me())}\b", "<me>", text)


def _scrub(value: Any, key: str = "", lease: bool = False) -> Any:
    if isinstance(value, dict):
        return {k: _scrub(v, k, lease) for k, v in value.items()}
    if isinstance(value, list):
        return [_scrub(v, lease=lease or key == "leases") for v in value]
    if lease and key == "pid":  # the job's; a simulated process's pid is fixed
        return 0
    if key in _VOLATILE_JSON and value is not None:
        return _VOLATILE_JSON[key]
    if key == "hostname":
        return "<host>"
    if key in ("user", "by") and value == _me():
        return "<me>"
    if key == "job" and isinstance(value, str):
        return "<job>"
    if key == "command" and isinstance(value, str):  # the job's: this venv's python
        return value.replace(sys.executable, "<python>")
    return value


def normalize_json(text: str) -> str:
    return json.dumps(_scrub(json.loads(text)), indent=2) + "\n"


def _status(cli: Callable[..., Any], args: tuple[str, ...], env: dict[str, str], job: str) -> Any:
    if job:
        inner = [sys.executable, "-m", "gpuwarden", "status", *args]
        mig = ("--mig", "2g.20gb") if job == "mig-job" else ()
        return cli("run", "-g", "1", *mig, "--", *inner, env=env)
    if args[:1] == ("--sim",):
        return cli(*args, "status", env=env)
    return cli("status", *args, env=env)


@pytest.mark.parametrize("case", sorted(CASES))
def test_status_output_is_the_golden_one(cli: Callable[..., Any], sim: Any, case: str) -> None:
    spec, args, env, setup = CASES[case]
    if spec:
        sim(spec)
    env = {"COLUMNS": "200", **env}
    if setup == "drain":
        assert cli("drain", "1", "--reason", "fan noise").returncode == 0
    result = _status(cli, args, env, job=setup if setup.endswith("job") else "")
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""
    got = normalize_json(result.stdout) if "--json" in args else normalize_text(result.stdout)
    path = GOLDEN / f"status-{case}.txt"
    if REGEN:
        GOLDEN.mkdir(exist_ok=True)
        path.write_text(got, encoding="utf-8")
        return
    assert path.exists(), f"no {path.name}: GPUWARDEN_REGEN_GOLDEN=1 pytest {__file__} writes it"
    want = path.read_text(encoding="utf-8")
    if got != want:
        diff = "".join(
            difflib.unified_diff(
                want.splitlines(True), got.splitlines(True), f"golden/{path.name}", "status"
            )
        )
        pytest.fail(
            f"status output differs from {path.name} (if on purpose: "
            f"GPUWARDEN_REGEN_GOLDEN=1 pytest tests/test_status_golden.py):\n{diff}",
            pytrace=False,
        )


def test_every_golden_file_has_a_case() -> None:
    stale = [p.name for p in GOLDEN.glob("status-*.txt") if p.stem[len("status-") :] not in CASES]
    assert not stale, f"golden files without a case in CASES: {stale}"


def test_normalizing_keeps_what_matters() -> None:
    host = socket.gethostname()
    text = f"{host}  driver 550  CUDA 12.4\n  1  drained by {_me()}: fan noise\n"
    assert (
        normalize_text(text) == "<host>  driver 550  CUDA 12.4\n  1  drained by <me>: fan noise\n"
    )
    doc = {"taken_at": 5.0, "gpus": [{"drain": {"by": _me(), "at": 3.0, "reason": "x"}}]}
    assert json.loads(normalize_json(json.dumps(doc))) == {
        "taken_at": 0,
        "gpus": [{"drain": {"by": "<me>", "at": 0, "reason": "x"}}],
    }


def test_lease_rows_lose_only_their_per_run_cells() -> None:
    text = (
        "x\n\nLEASE  USER  JOB             PID  AGE  EXPIRES   COMMAND\n"
        "GPU 2  bob   10740-3f1175  10749   3s  with job  python t.py\n"
    )
    assert normalize_text(text).splitlines()[2:] == [
        "LEASE  USER  JOB  PID  AGE  EXPIRES  COMMAND",
        "GPU 2  bob  <job>  <pid>  <age>  with job  python t.py",
    ]
