"""The journal's own work per started job, side by side with another tree in one run.

    .venv/bin/python bench/journal.py [--jobs 1000] [--rounds 3] [--compare DIR]

What the service asks of its journal (service.store) for each job of a makespan run,
replayed in a process of each tree in turn on a fresh journal: the submit's commit,
the pass's reading of the users' usage and of the bookings, the STARTING commit and
the fsync before the go-ahead, the RUNNING change, and the end's commit (its state,
the user's and the account's usage charged, the run recorded). Measured: the CPU time
of those calls per job, and the SQL statements and commits they cost (counted on the
connection, so a tree that does not count them is counted too). The service's whole
CPU per job is `bench/service_cpu.py`'s; this is the part the journal takes, without
the forks and the machine that make that figure move on a shared machine.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

#: Run in a process of the tree measured (its `src` first on the path): prints a JSON line.
REPLAY = r"""
import json, os, sys, time
from gpuwarden.service import accounting, store as s
from gpuwarden.service.bookings import Bookings

jobs, path = int(sys.argv[1]), sys.argv[2]
journal = s.Store(path)
counted = [0]
journal.db.set_trace_callback(lambda _: counted.__setitem__(0, counted[0] + 1))
bookings = Bookings(journal)
later = getattr(journal, "later", None)  # a tree without it writes the RUNNING at once
half = 7 * 86400.0
base = dict(uid=1000, gid=1000, user="alice", argv=("true",), cwd="/tmp",
            env={"PATH": "/usr/bin:/bin"}, umask=0o22, request={"count": 1}, output="/dev/null")
journal.jobs()  # the in-memory copy, as a running service has it
t0, c0, k0 = time.process_time(), counted[0], journal.commits
for i in range(jobs):
    with journal.transaction(durable=False):  # the submit (its fsync shared by a turn)
        job = journal.add(s.new_job(**base))
    journal.usage(time.time(), half)  # the pass
    bookings.current(time.time())
    journal.update(job.id, durable=False, state=s.STARTING, gpus=("GPU-1",),
                   started=time.time(), reason=None, supervisor=10_000 + i)
    journal.sync()  # before the go-ahead
    if later is not None:
        later(job.id, state=s.RUNNING, pid=20_000 + i)
    else:
        journal.update(job.id, durable=False, state=s.RUNNING, pid=20_000 + i)
    now = time.time()
    running = journal.get(job.id)
    with journal.transaction(durable=False):  # the end (joblife.finish)
        journal.update(job.id, cpu_seconds=0.01, mem_peak=1 << 20, state=s.COMPLETED,
                       ended=now, exit_code=0, exit_signal=None, error=None, reason=None)
        journal.charge("alice", 0.05, now, half)
        accounting.record_run(journal.db, running, now, s.COMPLETED, 0.05)
        if hasattr(journal, "charge_account"):
            journal.charge_account(None, "alice", 0.05, now, half)
        else:
            accounting.charge_account(journal.db, None, "alice", 0.05, now, half)
cpu = time.process_time() - t0
print(json.dumps({"cpu_ms": cpu / jobs * 1e3, "statements": (counted[0] - c0) / jobs,
                  "commits": (journal.commits - k0) / jobs}))
"""


def measure(tree: Path, jobs: int) -> dict[str, float]:
    work = tempfile.mkdtemp(prefix="gw-journal-")
    env = dict(os.environ, PYTHONPATH=str(tree / "src"))
    run = subprocess.run(
        [sys.executable, "-c", REPLAY, str(jobs), os.path.join(work, "state.db")],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    if run.returncode != 0:
        raise SystemExit(f"{tree}: the replay failed:\n{run.stderr}")
    return dict(json.loads(run.stdout.strip().splitlines()[-1]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--compare", metavar="DIR", help="another checkout, measured in turn")
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT / "bench"))
    from conditions import bytecode, tree_root

    trees = [ROOT, *([tree_root(args.compare)] if args.compare else [])]
    bytecode(tuple(trees))
    results: dict[Path, list[dict[str, float]]] = {t: [] for t in trees}
    for _ in range(args.rounds):
        for tree in trees:
            results[tree].append(measure(tree, args.jobs))
    keys = ("cpu_ms", "statements", "commits")
    print(f"the journal's work per started job, {args.jobs} jobs, best of {args.rounds} rounds:")
    print(f"{'tree':40s} " + " ".join(f"{k:>12s}" for k in keys))
    best = {t: {k: min(r[k] for r in runs) for k in keys} for t, runs in results.items()}
    for tree in trees:
        print(f"{str(tree)[-40:]:40s} " + " ".join(f"{best[tree][k]:12.3f}" for k in keys))
    if args.compare:
        ratios = ", ".join(f"{k} {best[ROOT][k] / best[trees[1]][k]:.2f}x" for k in keys)
        print(f"this tree / the other: {ratios}")


if __name__ == "__main__":
    main()
