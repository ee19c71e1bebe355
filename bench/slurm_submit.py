"""What `gpuwarden submit --slurm` adds to `sbatch`'s own time, side by side.

    .venv/bin/python bench/slurm_submit.py [--rounds 15]      # against $SLURM_CONF
    .venv/bin/python bench/slurm_submit.py --start            # a throw-away Slurm (root)

Cases, timed interleaved round by round so machine load hits them alike:
  sbatch --parsable < script                 Slurm's own submission of the same script
  gpuwarden submit --slurm -g 0 -- true      translate, submit, parse the id

Also timed, for scale: `python -c pass`, the interpreter's own start, which any Python
front end pays. Target: `submit --slurm` adds at most 50 ms (median wall time) to sbatch's. The jobs
are trivial (`true`, no GPU) and are cancelled at the end.
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TARGET_MS = 50.0
GPUWARDEN = [sys.executable, "-m", "gpuwarden"]


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def timed(argv: list[str], stdin: str | None, env: dict[str, str]) -> tuple[float, float, str]:
    """(wall seconds, CPU seconds of the process and what it waited for, the job id)."""
    cpu = _cpu()
    start = time.perf_counter()
    done = subprocess.run(argv, input=stdin, capture_output=True, text=True, env=env)
    took = time.perf_counter() - start
    if done.returncode != 0:
        sys.exit(f"{argv[0]} failed: {done.stderr.strip()}")
    return took, _cpu() - cpu, done.stdout.strip().splitlines()[-1].split(";")[0]


def main() -> int:
    from conditions import bytecode

    bytecode()
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=15)
    p.add_argument("--start", action="store_true", help="start a Slurm with scripts/slurm-ci")
    args = p.parse_args()
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(x for x in (str(ROOT / "src"), env.get("PYTHONPATH")) if x)
    top = None
    if args.start:
        top = Path(tempfile.mkdtemp(prefix="gw-bench-slurm-"))
        subprocess.run([str(ROOT / "scripts" / "slurm-ci"), "start", str(top)], check=True)
        env["SLURM_CONF"] = str(top / "slurm.conf")
    elif not env.get("SLURM_CONF") and not os.path.exists("/etc/slurm/slurm.conf"):
        sys.exit("no Slurm to submit to: set SLURM_CONF or pass --start")
    out = tempfile.mkdtemp(prefix="gw-bench-out-")
    script = f"#!/bin/bash\n#SBATCH --output={out}/%j.out\nexec true\n"
    cases = {
        "sbatch --parsable < script": (["sbatch", "--parsable"], script),
        "gpuwarden submit --slurm -g 0 -- true": (
            [*GPUWARDEN, "submit", "--slurm", "-g", "0", "--output", f"{out}/%j.out", "--", "true"],
            None,
        ),
    }
    floor = "python -c pass (the interpreter's start)"
    times: dict[str, list[float]] = {name: [] for name in cases}
    cpus: dict[str, list[float]] = {name: [] for name in cases}
    jobs: list[str] = []
    try:
        for argv, stdin in cases.values():  # warm both once
            jobs.append(timed(argv, stdin, env)[2])
        for _ in range(args.rounds):
            for name, (argv, stdin) in cases.items():
                took, cpu, job = timed(argv, stdin, env)
                times[name].append(took)
                cpus[name].append(cpu)
                jobs.append(job)
            took, cpu, _ = timed([sys.executable, "-c", "print(0)"], None, env)
            times.setdefault(floor, []).append(took)
            cpus.setdefault(floor, []).append(cpu)
    finally:
        subprocess.run(["scancel", *jobs], env=env, capture_output=True)
        if top is not None:
            subprocess.run([str(ROOT / "scripts" / "slurm-ci"), "stop", str(top)])
            shutil.rmtree(top, ignore_errors=True)
        shutil.rmtree(out, ignore_errors=True)
    medians = {name: statistics.median(t) * 1000 for name, t in times.items()}
    cpu_ms = {name: statistics.median(t) * 1000 for name, t in cpus.items()}
    for name, ms in medians.items():
        low = min(times[name]) * 1000
        print(f"{name:<40} wall {ms:7.1f} ms (min {low:6.1f})  cpu {cpu_ms[name]:6.1f} ms")
    base, ours, _ = medians.values()
    added = ours - base
    cpu_base, cpu_ours, _ = cpu_ms.values()
    verdict = "ok" if added <= TARGET_MS else "OVER"
    print(
        f"{'added by gpuwarden':<40} wall {added:7.1f} ms{'':13}cpu {cpu_ours - cpu_base:6.1f} ms"
        f"  target <= {TARGET_MS:.0f} ms: {verdict}"
    )
    return 0 if added <= TARGET_MS else 1


if __name__ == "__main__":
    sys.exit(main())
