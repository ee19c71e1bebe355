"""How long `gpuwarden doctor` takes on the simulated 8xA100 server, against its floors.

Without torch: `gpuwarden doctor` with GPUWARDEN_DOCTOR_NO_TORCH=1 (torch is
treated as not installed) and with --no-torch-import (torch found, its
version file read, never started), against `python -c pass`. Budget: 150 ms.
With torch: plain `gpuwarden doctor` (torch asked in a child interpreter)
against `python -c "import torch"`. Budget: torch's import + 100 ms.

Runs are interleaved so that machine noise hits every command alike; the
figures are medians of wall time, and of CPU time (user+sys of the process
and of the children it waited for, so the torch probe counts): CPU time is
much less disturbed than wall time when other work shares the machine.

    .venv/bin/python bench/doctor.py [--runs N]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

PY = sys.executable


def once(cmd: list[str], env: dict[str, str]) -> tuple[float, float]:
    """(wall, cpu) seconds of one run."""
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    assert proc.stderr is not None
    err = proc.stderr.read()
    _, status, usage = os.wait4(proc.pid, 0)
    took = time.perf_counter() - start
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode not in (0, 1):
        raise SystemExit(f"{cmd} failed ({proc.returncode}): {err.decode()[-400:]}")
    return took, usage.ru_utime + usage.ru_stime


def measure(
    cases: dict[str, tuple[list[str], dict[str, str]]], runs: int
) -> tuple[dict[str, float], dict[str, float]]:
    """Median wall and CPU milliseconds per case."""
    walls: dict[str, list[float]] = {name: [] for name in cases}
    cpus: dict[str, list[float]] = {name: [] for name in cases}
    for cmd, env in cases.values():  # warm the page cache once
        once(cmd, env)
    for _ in range(runs):
        for name, (cmd, env) in cases.items():
            w, c = once(cmd, env)
            walls[name].append(w)
            cpus[name].append(c)
    return (
        {name: statistics.median(t) * 1000 for name, t in walls.items()},
        {name: statistics.median(t) * 1000 for name, t in cpus.items()},
    )


def main() -> None:
    from conditions import bytecode

    bytecode()
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=15)
    ap.add_argument("--torch-runs", type=int, default=5)
    args = ap.parse_args()
    state = tempfile.mkdtemp(prefix="gpuwarden-bench-")
    base = dict(os.environ, GPUWARDEN_SIM="server-8xa100", GPUWARDEN_SIM_STATE=state)
    base.pop("CUDA_VISIBLE_DEVICES", None)
    # Installed packages carry compiled bytecode; without it every run would recompile.
    base.pop("PYTHONDONTWRITEBYTECODE", None)
    no_torch = dict(base, GPUWARDEN_DOCTOR_NO_TORCH="1")
    doctor = [PY, "-m", "gpuwarden", "doctor"]

    fast, fast_cpu = measure(
        {
            "python -c pass": ([PY, "-c", "pass"], base),
            "doctor (no torch)": (doctor, no_torch),
            "doctor --no-torch-import": ([*doctor, "--no-torch-import"], base),
        },
        args.runs,
    )
    floor = fast["python -c pass"]
    print(f"simulated server-8xa100, median of {args.runs} runs (wall ms; cpu ms)")
    for name, ms in fast.items():
        extra = verdict = ""
        if not name.startswith("python"):
            extra = f"  ({ms / floor:.1f}x floor, +{ms - floor:.0f} ms)"
            verdict = "  OK" if ms < 150 else "  OVER 150 ms"
        print(f"  {name:<28} {ms:7.1f}; {fast_cpu[name]:6.1f}{extra}{verdict}")

    try:
        import importlib.util

        has_torch = importlib.util.find_spec("torch") is not None
    except (ImportError, ValueError):
        has_torch = False
    if not has_torch:
        print("torch not installed: the with-torch comparison is skipped")
        return
    slow, slow_cpu = measure(
        {
            'python -c "import torch"': ([PY, "-c", "import torch"], base),
            "doctor (torch probed)": (doctor, base),
        },
        args.torch_runs,
    )
    t_floor = slow['python -c "import torch"']
    t_doc = slow["doctor (torch probed)"]
    c_floor = slow_cpu['python -c "import torch"']
    c_doc = slow_cpu["doctor (torch probed)"]
    print(f"with torch, median of {args.torch_runs} runs (wall ms; cpu ms, probe included)")
    floor_name = 'python -c "import torch"'
    print(f"  {floor_name:<28} {t_floor:7.1f}; {c_floor:6.1f}")
    verdict = "OK" if t_doc <= t_floor + 100 else "OVER budget (import + 100 ms)"
    print(
        f"  {'doctor (torch probed)':<28} {t_doc:7.1f}; {c_doc:6.1f}  ({t_doc / t_floor:.2f}x, "
        f"{t_doc - t_floor:+.0f} ms wall, {c_doc - c_floor:+.0f} ms cpu)  {verdict}"
    )


if __name__ == "__main__":
    main()
