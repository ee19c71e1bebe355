"""Leases under load: many clients, each running many short jobs with `--wait`
semantics on the simulated 8-GPU server; from every lease interval, check that no
two overlap on one GPU and that every job ran exactly once.

    .venv/bin/python bench/stress.py [--clients 200] [--jobs 50] [--hold-ms 0]

Each client is a process forked from this one that loops `gpuwarden run`'s own
code path in-process (`allocation.acquire(wait=True)` -> `launch.start(["true"])` ->
`publish` -> wait -> `release`), so 10,000 jobs do not pay 10,000 interpreter
start-ups on a small machine. The interval logged is from the grant (locks
taken) to the release, which contains the job's whole life: a stricter check
than the job's own start/end. Clients re-read the machine at most once a
second (`--fresh` re-reads it at every attempt, as `gpuwarden run --wait` does);
nothing else on the machine changes during the run.
"""

from __future__ import annotations

import argparse
import itertools
import os
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))


def client(number: int, jobs: int, hold: float, fresh: bool, out: str) -> None:
    from gpuwarden.jobs import allocation, launch
    from gpuwarden.machine.inventory import read_snapshot
    from gpuwarden.placement.request import Request

    cached = [0.0, None]

    def machine():  # type: ignore[no-untyped-def]
        now = time.monotonic()
        if fresh or cached[1] is None or now - cached[0] > 1.0:
            cached[:] = [now, read_snapshot(processes=True)]
        return cached[1]

    lines = []
    waits = 0
    seen: list[object] = []

    def note(*progress: object) -> None:
        seen.append(progress)

    for j in range(jobs):
        seen.clear()
        held = allocation.acquire(Request(count=1), snapshot=machine, wait=True, on_wait=note)
        granted = time.monotonic_ns()
        waits += bool(seen)
        held.prepare("true")  # as `gpuwarden run`: the record is written before the job starts
        job = launch.start(["true"], launch.job_env(os.environ, held.gpus, job=held.job), held.fds)
        held.publish(job.pid)
        if hold:
            time.sleep(hold)
        code = job.wait()
        released = time.monotonic_ns()
        held.release()
        lines.append(f"{held.uuids[0]} {number}:{j} {granted} {released} {code}\n")
    lines.append(f"# waits {waits}\n")
    with open(out, "w") as fh:
        fh.writelines(lines)


def check(paths: list[str], clients: int, jobs: int) -> dict[str, object]:
    intervals: dict[str, list[tuple[int, int, str]]] = defaultdict(list)
    seen: dict[str, int] = defaultdict(int)
    waits = 0
    for path in paths:
        for line in Path(path).read_text().splitlines():
            if line.startswith("# waits"):
                waits += int(line.split()[2])
                continue
            gpu, job, start, end, code = line.split()
            assert code == "0", f"job {job} exited {code}"
            seen[job] += 1
            intervals[gpu].append((int(start), int(end), job))
    expected = {f"{c}:{j}" for c in range(clients) for j in range(jobs)}
    missing = expected - set(seen)
    twice = [j for j, n in seen.items() if n > 1]
    overlaps = 0
    for spans in intervals.values():
        spans.sort()
        for (_, end0, _), (start1, _, _) in itertools.pairwise(spans):
            overlaps += start1 < end0
    busy = {gpu: sum(e - s for s, e, _ in spans) / 1e9 for gpu, spans in sorted(intervals.items())}
    return {
        "missing": len(missing),
        "twice": len(twice),
        "overlaps": overlaps,
        "jobs": sum(seen.values()),
        "waits": waits,
        "per_gpu": {gpu: len(spans) for gpu, spans in sorted(intervals.items())},
        "busy_s": busy,
    }


def main() -> int:
    from conditions import bytecode

    bytecode()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=200)
    parser.add_argument("--jobs", type=int, default=50)
    parser.add_argument(
        "--hold-ms", type=float, default=10.0, help="time each job holds its GPU (0: none)"
    )
    parser.add_argument("--fresh", action="store_true", help="read NVML at every attempt")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        os.environ.update(
            GPUWARDEN_SIM="server-8xa100",
            GPUWARDEN_SIM_STATE=os.path.join(tmp, "sim"),
            GPUWARDEN_LEASE_DIR=os.path.join(tmp, "leases"),
            GPUWARDEN_STATE_DIR=os.path.join(tmp, "state"),
            GPUWARDEN_SYSTEM_CONFIG=os.path.join(tmp, "etc", "config.toml"),
            XDG_CONFIG_HOME=os.path.join(tmp, "xdg"),
        )
        os.environ.pop("CUDA_VISIBLE_DEVICES", None)
        from gpuwarden.sim import Machine

        machine = Machine.open()
        for p in machine.state()["processes"]:  # an idle server: all 8 GPUs leasable
            machine.remove_process(p["pid"])
        # Import everything once here; forked clients share it.
        import gpuwarden.jobs.allocation  # noqa: F401
        from gpuwarden.health import drain  # noqa: F401
        from gpuwarden.jobs import launch  # noqa: F401
        from gpuwarden.machine.inventory import read_snapshot

        read_snapshot()
        outs = [os.path.join(tmp, f"client-{c}.log") for c in range(args.clients)]
        t0 = time.monotonic()
        cpu0 = os.times()
        pids = []
        for c in range(args.clients):
            pid = os.fork()
            if pid == 0:
                code = 0
                try:
                    client(c, args.jobs, args.hold_ms / 1000, args.fresh, outs[c])
                except BaseException as err:  # report, never hang the bench
                    print(f"client {c}: {err!r}", file=sys.stderr)
                    code = 1
                os._exit(code)
            pids.append(pid)
        failed = 0
        for pid in pids:
            _, status = os.waitpid(pid, 0)
            failed += os.waitstatus_to_exitcode(status) != 0
        wall = time.monotonic() - t0
        cpu1 = os.times()
        cpu = (cpu1.children_user - cpu0.children_user) + (
            cpu1.children_system - cpu0.children_system
        )
        result = check([o for o in outs if os.path.exists(o)], args.clients, args.jobs)
        total = args.clients * args.jobs
        print(
            f"{args.clients} clients x {args.jobs} jobs = {total} jobs on sim:server-8xa100 "
            f"({os.cpu_count()} CPUs), snapshots {'fresh' if args.fresh else 'cached 1 s'}"
        )
        print(
            f"wall {wall:.1f} s, {total / wall:.0f} jobs/s, CPU {cpu:.1f} s "
            f"({cpu / total * 1000:.1f} ms per job incl. fork+exec of the job)"
        )
        print(
            f"jobs ran: {result['jobs']}, missing {result['missing']}, twice {result['twice']}, "
            f"failed clients {failed}"
        )
        print(f"overlapping lease intervals on one GPU: {result['overlaps']}")
        print(f"grants that had to wait in line: {result['waits']}")
        print("jobs per GPU: " + ", ".join(str(n) for n in result["per_gpu"].values()))
        ok = not (result["missing"] or result["twice"] or result["overlaps"] or failed)
        print("PASS" if ok else "FAIL")
        return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
