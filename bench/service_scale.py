"""Whether the queue service slows with its queue, side by side with Slurm.

    .venv/bin/python bench/service_scale.py [--levels 0,1000,10000] [--samples 200]
                                            [--no-slurm]

Run as root (the service and slurmctld both are). At each level the queue is filled
with that many held jobs (the service: one `submit` request each; Slurm: `sbatch
--hold`, eight at a time), then measured:

- submit: `--samples` more held one-GPU jobs, one at a time; p50 and p99 of each
  submission's wall time (the service: one request on an open connection, its
  durable commit included; Slurm: the `sbatch --hold` command, its start-up
  included, as Slurm is used), and the daemon's CPU time per submission (the
  service's, slurmctld's; from /proc schedstat): the work a submit costs, which
  a busy disk does not move as it moves a commit's fsync;
- listing: every row of the queue (the service: the lines of `queue`'s table page
  after page, as `gpuwarden queue --all` asks for them; Slurm: one `squeue`), and
  as a command (the median of five: `gpuwarden queue --all`, the console script;
  `squeue`);
- planning: the service's own figure for its last scheduling pass (`stats` ->
  `plan`), Slurm's `sdiag` "Main schedule statistics: Last cycle".

Printed per system: each figure at each level, and its ratio to the empty queue's
(the target for the service: submit p50 and p99 within 2x at 10,000 pending).
Slurm runs with its default scheduler parameters but MaxJobCount raised (its
default, 10,000, would refuse the last submissions at the top level).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from service import GpuwardenQueue, Slurm, pct  # bench/service.py

HELD = "true"
SBATCH = ["sbatch", "-Q", "--hold", "-c", "1", "--mem=10", "--gres=gpu:1", "-o", "/dev/null"]


class ServiceScale:
    """The service's side: held jobs over one connection, its own planning figure."""

    def __init__(self, work: Path) -> None:
        self.q = GpuwardenQueue(work)
        self.name = self.q.name
        self.pid = self.q.pid
        self.work = work

    def submit(self) -> None:
        self.q.client.call(
            "submit",
            argv=[HELD],
            cwd=str(self.work),
            env={"PATH": "/usr/bin:/bin"},
            output="/dev/null",
            request={"count": 1},
            hold=True,
        )

    def fill(self, n: int) -> None:
        for _ in range(n):
            self.submit()

    def listing(self) -> int:
        """Every line of the table, page after page, as `gpuwarden queue --all` asks."""
        rows, offset = 0, 0
        while offset is not None:
            reply = self.q.client.call("queue", offset=offset, limit=5000, arrays=True, table=True)
            rows += len(reply["lines"])
            offset = reply["next"]
        return rows

    def command_ms(self) -> float:
        """`gpuwarden queue --all` as a user types it (the console script): its wall ms."""
        env = dict(os.environ, GPUWARDEN_SOCKET=self.q.socket, COLUMNS="200")
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        argv = [str(Path(sys.executable).parent / "gpuwarden"), "queue", "--all"]
        t0 = time.perf_counter()
        subprocess.run(argv, env=env, stdout=subprocess.DEVNULL, check=True)
        return (time.perf_counter() - t0) * 1000

    def planning_ms(self) -> float:
        """The last pass's time once a pass has seen the whole queue."""
        self.q.client.call("stats")  # answered after the loop planned what it was told
        plan = self.q.client.call("stats").get("plan") or {}
        return float(plan.get("last_seconds", float("nan"))) * 1000

    def close(self) -> None:
        self.q.close()


class SlurmScale:
    """Slurm's side: `sbatch --hold`, `squeue`, `sdiag`."""

    def __init__(self, work: Path) -> None:
        self.s = Slurm(work, tuned=False)
        self.name = self.s.name
        self.pid = self.s.pid  # slurmctld
        self.work = work

    def submit(self) -> None:
        subprocess.run(
            [*SBATCH, "-D", str(self.work), "--wrap", HELD],
            env=self.s.env,
            check=True,
        )

    def fill(self, n: int) -> None:
        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            list(pool.map(lambda _: self.submit(), range(n)))

    def listing(self) -> int:
        out = subprocess.run(
            ["squeue", "-h", "-o", "%i %T %r"], env=self.s.env, capture_output=True, text=True
        )
        return len(out.stdout.splitlines())

    def command_ms(self) -> float:
        """`squeue` with its default columns: its wall ms."""
        t0 = time.perf_counter()
        subprocess.run(["squeue"], env=self.s.env, stdout=subprocess.DEVNULL, check=True)
        return (time.perf_counter() - t0) * 1000

    def planning_ms(self) -> float:
        out = subprocess.run(["sdiag"], env=self.s.env, capture_output=True, text=True).stdout
        main = out.split("Main schedule statistics", 1)[-1]
        found = re.search(r"Last cycle:\s+(\d+)", main)
        return int(found.group(1)) / 1000 if found else float("nan")

    def close(self) -> None:
        self.s.close()


def cpu_ns(pid: int) -> int:
    """CPU time of every thread of `pid` so far, in nanoseconds (/proc schedstat)."""
    total = 0
    for task in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{task}/schedstat") as fh:
            total += int(fh.read().split()[0])
    return total


def measure(system: Any, levels: list[int], samples: int) -> dict[int, dict[str, float]]:
    print(f"-- {system.name}", flush=True)
    out: dict[int, dict[str, float]] = {}
    have = 0
    for level in levels:
        system.fill(level - have)
        have = level
        times = []
        cpu = cpu_ns(system.pid)
        for _ in range(samples):
            t0 = time.perf_counter()
            system.submit()
            times.append((time.perf_counter() - t0) * 1000)
        cpu = (cpu_ns(system.pid) - cpu) / 1e6 / samples
        have += samples
        t0 = time.perf_counter()
        rows = system.listing()
        listing = (time.perf_counter() - t0) * 1000
        row = {
            "cpu": cpu,
            "p50": statistics.median(times),
            "p99": pct(times, 0.99),
            "listing": listing,
            "rows": rows,
            "planning": system.planning_ms(),
            "command": statistics.median(system.command_ms() for _ in range(5)),
        }
        out[level] = row
        print(
            "   {:>6} pending: submit p50 {p50:.2f} ms, p99 {p99:.2f} ms, daemon CPU "
            "{cpu:.3f} ms; "
            "listing {listing:.1f} ms ({rows} rows), as a command {command:.1f} ms; "
            "planning {planning:.2f} ms".format(level, **row),
            flush=True,
        )
    return out


def report(name: str, result: dict[int, dict[str, float]]) -> None:
    base = result[min(result)]
    for level, row in result.items():
        ratios = ", ".join(
            f"{key} x{row[key] / base[key]:.2f}" if base[key] > 0 else f"{key} -"
            for key in ("cpu", "p50", "p99", "listing", "command", "planning")
        )
        print(f"   {name}, {level} pending vs {min(result)}: {ratios}")


def main() -> None:
    from conditions import bytecode

    bytecode()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--levels", default="0,1000,10000")
    parser.add_argument("--samples", type=int, default=200)
    parser.add_argument("--no-slurm", action="store_true")
    args = parser.parse_args()
    levels = sorted(int(v) for v in args.levels.split(","))
    results = {}
    with tempfile.TemporaryDirectory(prefix="gw-scale-") as tmp:
        work = Path(tmp)
        makers = [("service", ServiceScale)] + ([] if args.no_slurm else [("slurm", SlurmScale)])
        for tag, make in makers:
            (work / tag).mkdir()
            system = make(work / tag)
            try:
                results[system.name] = measure(system, levels, args.samples)
            finally:
                system.close()
    print("-- ratios to the emptiest level (target for the service: submit within x2)")
    for name, result in results.items():
        report(name, result)
    if len(results) == 2:
        (sname, svc), (lname, slurm) = results.items()
        top = max(levels)
        print(
            f"   at {top} pending, {lname} / {sname}: daemon CPU per submit "
            f"x{slurm[top]['cpu'] / svc[top]['cpu']:.2f}, submit p50 "
            f"x{slurm[top]['p50'] / svc[top]['p50']:.1f}, p99 "
            f"x{slurm[top]['p99'] / svc[top]['p99']:.1f}, listing "
            f"x{slurm[top]['listing'] / svc[top]['listing']:.1f}; "
            f"`gpuwarden queue --all` / `squeue` x{svc[top]['command'] / slurm[top]['command']:.2f}"
            " (line <= 1.5)"
        )


if __name__ == "__main__":
    main()
