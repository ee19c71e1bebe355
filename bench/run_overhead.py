"""What `gpuwarden run` adds to a job's start, side by side with the floor and with
what users do today, on the simulated 8-GPU server.

    .venv/bin/python bench/run_overhead.py [--rounds 15] [--importtime] [--compare DIR]...

Cases, timed interleaved round by round so machine load hits them alike:
  true                                         the floor: fork+exec of nothing
  python -c pass                               the interpreter's own start-up
  gpuwarden run -g 1 -- true                   choose, lease, set the env, run, free
  CUDA_VISIBLE_DEVICES=$(nvisel -n 1) true     today's pattern (nvitop's nvisel)

Targets: `run` adds at most 40 ms over `python -c pass`, and at most half of
what the nvisel pattern adds over `true`. Wall time is the figure; CPU time
(user+sys of the case and the children it waited for) is printed beside it,
because on a shared or virtual machine it is much less disturbed by other load.
nvisel reads the same simulated machine through gpuwarden's pynvml shim on
PYTHONPATH. `--importtime` also prints the slowest imports on the `run` path
(python -X importtime). `--compare DIR` adds `gpuwarden run` from another source
tree (another checkout or worktree, e.g. main, named by its root or its `src`) to
the same rounds, with its own simulator state (the parsed-spec cache is keyed by
the parsing code's file). The
machine's load average is printed before and after: on a shared machine, compare
CPU time between runs and wall time only within one. `--instructions` counts, with
valgrind, the instructions each python and gpuwarden case executes: a figure that
a busy or slowed machine does not move, for comparing trees across runs.
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
BIN = Path(sys.executable).parent
NVISEL = "CUDA_VISIBLE_DEVICES=$(nvisel -n 1) true"
SHIM = ROOT / "src" / "gpuwarden" / "sim" / "shim"


def environment(tmp: str) -> dict[str, str]:
    env = dict(os.environ)
    # PYTHONDONTWRITEBYTECODE would make every run recompile the modules changed since
    # their .pyc was written; an installed gpuwarden has its bytecode, so measure that.
    for name in ("CUDA_VISIBLE_DEVICES", "GPU_IDS", "PYTHONDONTWRITEBYTECODE"):
        env.pop(name, None)
    env.update(
        GPUWARDEN_SIM="server-8xa100",
        GPUWARDEN_SIM_STATE=os.path.join(tmp, "sim"),
        GPUWARDEN_LEASE_DIR=os.path.join(tmp, "leases"),
        GPUWARDEN_STATE_DIR=os.path.join(tmp, "state"),
        # The direct path: a queue service on this machine would otherwise take the jobs.
        GPUWARDEN_SOCKET=os.path.join(tmp, "no-service.sock"),
        GPUWARDEN_SYSTEM_CONFIG=os.path.join(tmp, "etc", "config.toml"),
        XDG_CONFIG_HOME=os.path.join(tmp, "xdg"),
        PATH=f"{BIN}{os.pathsep}{env.get('PATH', '')}",
        # This tree's sources, whatever the virtual environment has installed.
        PYTHONPATH=str(ROOT / "src"),
    )
    return env


def sources(tree: str) -> str:
    """The directory holding `gpuwarden/` of a tree given as its root or as its `src`."""
    from conditions import tree_root

    return str(tree_root(tree) / "src")


def cases(
    env: dict[str, str], compare: list[str], tmp: str
) -> list[tuple[str, list[str], dict[str, str]]]:
    gw = (
        [str(BIN / "gpuwarden")]
        if (BIN / "gpuwarden").exists()
        else [
            sys.executable,
            "-m",
            "gpuwarden",
        ]
    )
    nvisel_env = dict(env, PYTHONPATH=f"{SHIM}{os.pathsep}{env.get('PYTHONPATH', '')}")
    others = [
        (
            f"gpuwarden run -g 1 -- true ({tree})",
            [*gw, "run", "-g", "1", "--", "true"],
            dict(
                env,
                PYTHONPATH=sources(tree),
                GPUWARDEN_SIM_STATE=os.path.join(tmp, f"sim-{number}"),
            ),
        )
        for number, tree in enumerate(compare)
    ]
    # The shell pattern exits 0 whether or not nvisel ran: without nvisel it would time
    # a shell and a failed lookup, and call that nvisel's figure.
    found = shutil.which("nvisel", path=env.get("PATH"))
    if found is None:
        print("(nvisel, nvitop's, is not installed here: no figure for its pattern)")
    pattern = [
        (
            NVISEL,
            ["sh", "-c", f"CUDA_VISIBLE_DEVICES=$({found} -n 1 2>/dev/null) true"],
            nvisel_env,
        )
    ]
    return [
        ("true", ["true"], env),
        ("python -c pass", [sys.executable, "-c", "pass"], env),
        ("gpuwarden run -g 1 -- true", [*gw, "run", "-g", "1", "--", "true"], env),
        *(pattern if found else []),
        *others,
    ]


def once(argv: list[str], env: dict[str, str]) -> tuple[float, float]:
    """(wall, CPU) seconds of one run."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    done = subprocess.run(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    elapsed = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise SystemExit(f"{argv}: exit {done.returncode}: {done.stderr.decode()[-500:]}")
    cpu = after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime
    return elapsed, cpu


def import_costs(env: dict[str, str], top: int = 12) -> None:
    # The console script, as users run it (`-m` would add runpy's own imports).
    script = BIN / "gpuwarden"
    entry = [str(script)] if script.exists() else ["-m", "gpuwarden"]
    argv = [sys.executable, "-X", "importtime", *entry, "run", "-g", "1", "--", "true"]
    err = subprocess.run(argv, env=env, capture_output=True, text=True).stderr
    rows = []
    for line in err.splitlines():
        if line.startswith("import time:") and "|" in line and "cumulative" not in line:
            _, self_us, cumulative, name = (p.strip() for p in line.replace(":", "|", 1).split("|"))
            rows.append((int(cumulative), int(self_us), name.strip()))
    print(f"\nslowest imports on the run path (cumulative ms, top {top}):")
    for cumulative, self_us, name in sorted(rows, reverse=True)[:top]:
        print(f"  {cumulative / 1000:7.1f}  (self {self_us / 1000:5.1f})  {name}")


def instructions(argv: list[str], env: dict[str, str]) -> int:
    """User-space instructions of one run of `argv`'s own process (not its children),
    counted by valgrind's callgrind: the same on a quiet and on a busy machine."""
    out = subprocess.run(
        ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null", *argv],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    for line in out.stderr.splitlines():
        if "Collected :" in line:
            return int(line.split()[-1])
    raise SystemExit(f"{argv}: valgrind gave no count: {out.stderr[-500:]}")


def count_instructions(table: list[tuple[str, list[str], dict[str, str]]]) -> None:
    """The python and gpuwarden cases (the shell pattern is a tree of processes), each
    counted twice: the two counts differ only by hash seeds and timing."""
    counts = {
        name: min(instructions(argv, env) for _ in range(2))
        for name, argv, env in table
        if name == "python -c pass" or name.startswith("gpuwarden")
    }
    py = counts["python -c pass"]
    print("\ninstructions (callgrind, the process itself, millions; over `python -c pass`):")
    for name, n in counts.items():
        print(f"  {name:<50} {n / 1e6:8.1f}  {(n - py) / 1e6:+8.1f}")


def main() -> int:
    from conditions import bytecode

    bytecode()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--importtime", action="store_true")
    parser.add_argument("--compare", action="append", default=[], metavar="DIR")
    parser.add_argument(
        "--instructions",
        action="store_true",
        help="also count each case's instructions with valgrind (steady where timing is not)",
    )
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        env = environment(tmp)
        table = cases(env, args.compare, tmp)
        load_before = os.getloadavg()
        for _, argv, case_env in table:  # warm caches (bytecode, page cache) for all alike
            once(argv, case_env)
        times: dict[str, list[float]] = {name: [] for name, _, _ in table}
        cpu: dict[str, list[float]] = {name: [] for name, _, _ in table}
        for _ in range(args.rounds):
            for name, argv, case_env in table:
                wall, used = once(argv, case_env)
                times[name].append(wall)
                cpu[name].append(used)
        med = {name: statistics.median(ts) * 1000 for name, ts in times.items()}
        low = {name: min(ts) * 1000 for name, ts in times.items()}
        med_cpu = {name: statistics.median(ts) * 1000 for name, ts in cpu.items()}
        load_after = os.getloadavg()
        print(f"{args.rounds} rounds on sim:server-8xa100, {os.cpu_count()} CPUs")
        print(f"load average (1 min) before {load_before[0]:.2f}, after {load_after[0]:.2f}")
        print(f"{'case':<52} {'median ms':>10} {'min ms':>8} {'cpu ms':>8}")
        for name, _, _ in table:
            print(f"{name:<52} {med[name]:>10.1f} {low[name]:>8.1f} {med_cpu[name]:>8.1f}")
        run, py, floor = med["gpuwarden run -g 1 -- true"], med["python -c pass"], med["true"]
        over_py = run - py
        print(
            f"\nrun adds {over_py:.1f} ms over `python -c pass` (target <= 40 ms): "
            f"{'met' if over_py <= 40 else 'NOT met'}"
        )
        if NVISEL in med:
            nvisel = med[NVISEL]
            run_added, nvisel_added = run - floor, nvisel - floor
            ratio = run_added / nvisel_added if nvisel_added > 0 else float("nan")
            print(
                f"run adds {run_added:.1f} ms over `true`; the nvisel pattern adds "
                f"{nvisel_added:.1f} ms: ratio {ratio:.2f} (target <= 0.5): "
                f"{'met' if ratio <= 0.5 else 'NOT met'}"
            )
            print(f"nvisel pattern / run = {nvisel / run:.2f}x")
        print(f"run / python -c pass = {run / py:.2f}x")
        cpu_over = med_cpu["gpuwarden run -g 1 -- true"] - med_cpu["python -c pass"]
        print(f"(CPU time: run adds {cpu_over:.1f} ms over `python -c pass`)")
        for name, _, _ in table[3 + (NVISEL in med) :]:
            print(
                f"{name}: {med[name] - py:+.1f} ms wall, "
                f"{med_cpu[name] - med_cpu['python -c pass']:+.1f} ms CPU over `python -c pass`"
            )
        if args.importtime:
            import_costs(env)
        if args.instructions:
            count_instructions(table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
