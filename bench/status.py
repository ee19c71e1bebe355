"""`gpuwarden status` as a whole process vs gpustat, nvitop -1 and `python -c pass`.

All four run on the same simulated server-8xa100 (gpustat and nvitop through the
pynvml shim), each as a user types it (the console scripts), interleaved round by
round so machine noise hits them alike; the median wall and CPU time of each is
printed with its ratio to gpuwarden's. Targets: faster than gpustat, at most
0.4x `nvitop -1` in instructions (tests/test_instructions.py holds that line).

    .venv/bin/python bench/status.py [--runs N] [--compare DIR]... [--instructions]

`--instructions` also counts, with valgrind, the instructions `gpuwarden status` and
`nvitop -1` execute: the ratio a busy or a quiet machine does not move.

`--compare DIR` adds `gpuwarden status` from another source tree (e.g. main) to
the same rounds, with its own simulator state. The load average is printed
before and after: compare CPU time between runs, wall time only within one.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent


def main() -> int:
    from conditions import bytecode, tree_root

    bytecode()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=15)
    parser.add_argument("--compare", action="append", default=[], metavar="DIR")
    parser.add_argument("--instructions", action="store_true", help="also count instructions")
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT / "src"))
    from gpuwarden.sim.fake import SHIM_DIR

    env = dict(
        os.environ,
        GPUWARDEN_SIM="server-8xa100",
        GPUWARDEN_SIM_STATE=tempfile.mkdtemp(prefix="gpuwarden-bench-"),
        PYTHONPATH=f"{SHIM_DIR}{os.pathsep}{ROOT / 'src'}",
        COLUMNS="120",
    )
    # Installed packages carry compiled bytecode; let every tool here have it too.
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    commands = {
        "python -c pass": [sys.executable, "-c", "pass"],
        "gpuwarden status": [str(BIN / "gpuwarden"), "status"],
        "gpustat": [str(BIN / "gpustat")],
        "nvitop -1": [str(BIN / "nvitop"), "-1"],
    }
    envs = {name: env for name in commands}
    for number, tree in enumerate(args.compare):
        tree = str(tree_root(tree))
        name = f"status ({tree})"
        commands[name] = commands["gpuwarden status"]
        envs[name] = dict(
            env,
            PYTHONPATH=os.pathsep.join(
                str(Path(tree).resolve() / part) for part in ("src/gpuwarden/sim/shim", "src")
            ),
            GPUWARDEN_SIM_STATE=tempfile.mkdtemp(prefix=f"gpuwarden-bench-{number}-"),
        )
    times: dict[str, list[float]] = {name: [] for name in commands}
    cpu: dict[str, list[float]] = {name: [] for name in commands}
    for name, cmd in commands.items():  # warm the page cache and .pyc files
        subprocess.run(cmd, env=envs[name], capture_output=True, check=True, timeout=120)
    load_before = os.getloadavg()[0]
    for _ in range(args.runs):
        for name, cmd in commands.items():
            before = resource.getrusage(resource.RUSAGE_CHILDREN)
            start = time.perf_counter()
            subprocess.run(cmd, env=envs[name], capture_output=True, check=True, timeout=120)
            times[name].append(time.perf_counter() - start)
            after = resource.getrusage(resource.RUSAGE_CHILDREN)
            cpu[name].append(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime)
    medians = {name: statistics.median(t) for name, t in times.items()}
    cpu_medians = {name: statistics.median(t) for name, t in cpu.items()}
    ours = medians["gpuwarden status"]
    ours_cpu = cpu_medians["gpuwarden status"]
    print(f"server-8xa100, median of {args.runs} runs each (interleaved)")
    print(f"load average (1 min) before {load_before:.2f}, after {os.getloadavg()[0]:.2f}")
    print(f"  {'command':<18} {'wall':>9}  {'ratio':>6}   {'cpu':>9}  {'ratio':>6}")
    for name, value in medians.items():
        c = cpu_medians[name]
        print(
            f"  {name:<18} {value * 1000:6.1f} ms  {value / ours:5.2f}x   "
            f"{c * 1000:6.1f} ms  {c / ours_cpu:5.2f}x"
        )
    floor = medians["python -c pass"]
    print(f"  gpuwarden status above the interpreter floor: {(ours - floor) * 1000:.1f} ms")
    print(f"  gpustat / gpuwarden status = {medians['gpustat'] / ours:.2f} wall (target > 1)")
    print(f"  nvitop -1 / gpuwarden status = {medians['nvitop -1'] / ours:.2f} wall (target >= 3)")
    print("  (cpu = user+sys of the process: less disturbed by other load than wall time)")
    if args.instructions:
        from run_overhead import instructions  # bench/, this script's own directory

        counts = {
            name: instructions(commands[name], env) for name in ("gpuwarden status", "nvitop -1")
        }
        ratio = counts["gpuwarden status"] / counts["nvitop -1"]
        print("instructions (callgrind, millions):")
        for name, n in counts.items():
            print(f"  {name:<18} {n / 1e6:8.1f}")
        print(f"  gpuwarden status / nvitop -1 = {ratio:.3f} (target <= 0.4)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
