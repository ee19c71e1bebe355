"""What placing a job in its device cgroup adds to its start, side by side with and
without, on the simulated 8-GPU server (as root, where cgroup v1 `devices` exists).

    .venv/bin/python bench/cgroup_start.py [--rounds 15]

Cases, timed interleaved round by round so machine load hits them alike:
  gpuwarden run -g 1 -- true    enforce.devices = off
  gpuwarden run -g 1 -- true    enforce.devices = auto (a cgroup per job)

Target: the cgroup adds <= 5 ms to the start. Wall time is the figure; CPU time
(user+sys of the case and its children) is printed beside it, being much less
disturbed by other load on a shared or virtual machine. Also printed: the time the
wrapper itself waits for the cgroup on its way to the spawn (`prepare` +
`confine`, read in-process), which excludes what runs while NVML is read.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))

from run_overhead import BIN, environment, once

from gpuwarden.cgroups import devices, hierarchy


def critical_path(rounds: int) -> list[float]:
    """Milliseconds the wrapper spends on the cgroup outside the overlapped join: making
    it, then (after a stand-in for reading the GPUs) waiting for the join and writing the
    rules for one GPU of eight."""
    from gpuwarden.machine.inventory import read_snapshot

    spent = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        iso = devices.prepare()
        t1 = time.perf_counter()
        snap = read_snapshot(topology=False)
        t2 = time.perf_counter()
        iso.confine([snap.gpus[7].minor], devices.present_minors(snap.gpus))
        t3 = time.perf_counter()
        iso.close()
        spent.append(((t1 - t0) + (t3 - t2)) * 1000)
    return spent


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15)
    args = parser.parse_args()
    mode, why = hierarchy.detect()
    if mode != "cgroup-v1":
        print(f"no device isolation here ({why}): nothing to measure")
        return 1
    gw = (
        [str(BIN / "gpuwarden")]
        if (BIN / "gpuwarden").exists()
        else [sys.executable, "-m", "gpuwarden"]
    )
    argv = [*gw, "run", "-g", "1", "--", "true"]
    with tempfile.TemporaryDirectory() as tmp:
        env = environment(tmp)
        env["PYTHONPATH"] = os.pathsep.join(
            p
            for p in (
                str(Path(__file__).resolve().parent.parent / "src"),
                env.get("PYTHONPATH", ""),
            )
            if p
        )
        table = {
            "without (enforce.devices = off)": dict(env, GPUWARDEN_ENFORCE_DEVICES="off"),
            "with (enforce.devices = auto)": dict(env, GPUWARDEN_ENFORCE_DEVICES="auto"),
        }
        for case_env in table.values():
            once(argv, case_env)  # warm caches for both alike
        wall: dict[str, list[float]] = {name: [] for name in table}
        cpu: dict[str, list[float]] = {name: [] for name in table}
        for _ in range(args.rounds):
            for name, case_env in table.items():
                w, c = once(argv, case_env)
                wall[name].append(w * 1000)
                cpu[name].append(c * 1000)
        os.environ.update(env)
        inside = critical_path(args.rounds)
    print(
        f"{args.rounds} rounds of `gpuwarden run -g 1 -- true` on sim:server-8xa100, "
        f"{os.cpu_count()} CPUs"
    )
    print(f"{'case':<34} {'median ms':>10} {'min ms':>8} {'cpu ms':>8}")
    for name in table:
        med, low, c = statistics.median(wall[name]), min(wall[name]), statistics.median(cpu[name])
        print(f"{name:<34} {med:>10.1f} {low:>8.1f} {c:>8.1f}")
    off, on = (statistics.median(wall[n]) for n in table)
    cpu_off, cpu_on = (statistics.median(cpu[n]) for n in table)
    added = on - off
    print(
        f"\nthe cgroup adds {added:.1f} ms wall ({on / off:.3f}x), {cpu_on - cpu_off:.1f} ms CPU "
        f"(target <= 5 ms): {'met' if added <= 5 else 'NOT met'}"
    )
    print(
        "the wrapper's own wait on it (prepare + confine): "
        f"median {statistics.median(inside):.2f} ms, max {max(inside):.2f} ms"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
