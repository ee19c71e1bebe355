"""What a started job costs the machine's CPUs: the queue service's own, and its
supervisors' and jobs' (forks, the marker and exit record, the job's exec), side by
side with another tree in one run.

    .venv/bin/python bench/service_cpu.py [--jobs 200] [--rounds 2] [--compare DIR]

Run as root (the service is). A service of this tree (and of DIR, the checkout of
another tree, e.g. the previous main) on the simulated four idle A100s; `--jobs`
jobs of `true` submitted at once over one connection, as `bench/service.py`'s
makespan run does, until every one has ended. Measured: the service's CPU time
(/proc/PID/schedstat, every thread), the CPU of its children once reaped (the
supervisors and the jobs below them: /proc/PID/stat cutime+cstime, in clock ticks),
the live ones' (the forker, which forks the supervisors, and what it reaped), the
service's minor page faults (/proc/PID/stat field 10: a fork of the service makes its
pages copy-on-write, and it copies them back as it goes on), the scheduling passes,
NVML calls and journal commits, fsyncs and SQL statements per job (`stats`), and the
wall time per job. CPU time on a shared machine moves far less than wall time does;
the trees run in turn, round after round, so both see the same load.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
SPEC = str(ROOT / "tests" / "data" / "idle-4xa100.toml")
sys.path.insert(0, str(ROOT / "src"))

from gpuwarden.queueclient import protocol  # noqa: E402

TICK = os.sysconf("SC_CLK_TCK")
COUNTED = ("passes", "nvml", "commits", "fsyncs", "statements")  # the service's, per job


class Raw:
    """One connection to the service, requests pipelined."""

    def __init__(self, path: str) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.connect(path)
        self.decoder = protocol.Decoder()
        self.replies: list[dict[str, Any]] = []

    def send(self, op: str, **fields: Any) -> None:
        self.sock.sendall(protocol.encode({"v": protocol.VERSION, "op": op, **fields}))

    def receive(self) -> dict[str, Any]:
        while not self.replies:
            data = self.sock.recv(1 << 20)
            if not data:
                raise SystemExit("the service closed the connection")
            self.replies.extend(self.decoder.feed(data))
        reply = self.replies.pop(0)
        if not reply.get("ok"):
            raise SystemExit(f"the service refused: {reply}")
        return reply

    def call(self, op: str, **fields: Any) -> dict[str, Any]:
        self.send(op, **fields)
        return self.receive()


def own_cpu(pid: int) -> float:
    """Seconds of CPU of every thread of `pid`."""
    total = 0
    for task in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{task}/schedstat") as fh:
            total += int(fh.read().split()[0])
    return total / 1e9


def stat(pid: int) -> list[str]:
    """/proc/PID/stat's fields from the third (the state) on."""
    with open(f"/proc/{pid}/stat") as fh:
        return fh.read().rsplit(")", 1)[1].split()


def children_cpu(pid: int) -> float:
    """Seconds of CPU of `pid`'s children and theirs: the reaped ones', and the live
    ones' (the forker, whose reaped supervisors count in its own figure)."""
    fields = stat(pid)
    total = (int(fields[13]) + int(fields[14])) / TICK
    for task in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{task}/children") as fh:
                live = [int(c) for c in fh.read().split()]
        except OSError:
            continue
        for child in live:
            with contextlib.suppress(OSError, ValueError):  # ended: counted once reaped
                total += own_cpu(child) + children_cpu(child)
    return total


def minor_faults(pid: int) -> int:
    return int(stat(pid)[7])


def counters(raw: Raw) -> dict[str, float]:
    stats = raw.call("stats")
    return {
        "passes": stats["plan"]["count"],
        "nvml": stats["machine"]["nvml_calls"],
        "commits": stats["journal"]["commits"],
        "fsyncs": stats["journal"]["fsyncs"],
        # SQL statements the journal ran (a tree that does not count them: nan)
        "statements": stats["journal"].get("statements", float("nan")),
        "active": sum(sum(users.values()) for users in stats["jobs"].values()),
    }


def measure(tree: Path, jobs: int) -> dict[str, float]:
    work = Path(tempfile.mkdtemp(prefix="gw-cpu-"))
    sock = str(work / "gw.sock")
    env = dict(
        os.environ,
        PYTHONPATH=str(tree / "src"),
        GPUWARDEN_SIM=SPEC,
        GPUWARDEN_SIM_STATE=str(work / "sim"),
        GPUWARDEN_LEASE_DIR=str(work / "leases"),
        # No lab's settings: a machine's /etc/gpuwarden/config.toml (per-user limits,
        # a webhook) would change what is measured.
        GPUWARDEN_SYSTEM_CONFIG=str(work / "none.toml"),
        XDG_CONFIG_HOME=str(work / "xdg"),
    )
    serve = [sys.executable, "-m", "gpuwarden", "serve", "--log-level", "WARNING"]
    with open(work / "serve.log", "ab") as log:
        proc = subprocess.Popen(
            [*serve, "--socket", sock, "--state-dir", str(work / "state")],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    try:
        deadline = time.monotonic() + 60
        while not os.path.exists(sock):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"the service did not start: {(work / 'serve.log').read_text()}")
            time.sleep(0.05)
        time.sleep(0.2)
        raw = Raw(sock)
        job = {
            "argv": ["true"],
            "cwd": str(work),
            "env": {"PATH": "/usr/bin:/bin"},
            "output": "/dev/null",
            "request": {"count": 1},
        }

        def drained() -> dict[str, float]:
            while (c := counters(raw))["active"]:
                time.sleep(0.1)
            return c

        for _ in range(8):  # the first starts import what the later ones find loaded
            raw.call("submit", **job)
        before, own, kids = drained(), own_cpu(proc.pid), children_cpu(proc.pid)
        faults, t0 = minor_faults(proc.pid), time.time()
        for _ in range(jobs):
            raw.send("submit", **job)
        for _ in range(jobs):
            raw.receive()
        after = drained()
        wall = time.time() - t0
        out = {k: (after[k] - before[k]) / jobs for k in COUNTED}
        out["service_ms"] = (own_cpu(proc.pid) - own) / jobs * 1e3
        out["children_ms"] = (children_cpu(proc.pid) - kids) / jobs * 1e3
        out["faults"] = (minor_faults(proc.pid) - faults) / jobs
        out["wall_ms"] = wall / jobs * 1e3
        return out
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(30)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--compare", metavar="DIR", help="another checkout, measured in turn")
    args = parser.parse_args()
    from conditions import bytecode, tree_root

    trees = [ROOT, *([tree_root(args.compare)] if args.compare else [])]
    bytecode(tuple(trees))
    print(f"load before: {os.getloadavg()[0]:.2f}")
    results: dict[Path, list[dict[str, float]]] = {t: [] for t in trees}
    for _ in range(args.rounds):
        for tree in trees:
            results[tree].append(measure(tree, args.jobs))
    keys = ("service_ms", "children_ms", "wall_ms", "faults", *COUNTED)
    print(f"per job of `true`, {args.jobs} submitted at once, mean of {args.rounds} rounds:")
    print(f"{'tree':40s} " + " ".join(f"{k:>12s}" for k in keys))
    means = {}
    for tree, runs in results.items():
        means[tree] = {k: sum(r[k] for r in runs) / len(runs) for k in keys}
        print(f"{str(tree)[-40:]:40s} " + " ".join(f"{means[tree][k]:12.2f}" for k in keys))
    if args.compare:
        this, other = means[ROOT], means[trees[1]]
        print(
            "this tree / the other: "
            + ", ".join(f"{k} {this[k] / other[k]:.2f}x" for k in keys[:4] if other[k])
        )
    print(f"load after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
