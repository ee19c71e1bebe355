"""`gpuwarden status` marks GPU processes that belong to no lease (unreserved use)."""

from __future__ import annotations

import json
import sys

from gpuwarden.cli.status import unleased_pids
from gpuwarden.machine.inventory import Gpu, GpuProcess

JOB = """
import json, os, subprocess, sys
from gpuwarden.sim import Machine
# A process of the job on its leased GPU 7: under its lease, so not marked.
Machine.open().add_process(7, os.getpid(), "1GiB", user="me")
out = subprocess.run([sys.executable, "-m", "gpuwarden", "status", "--json"], capture_output=True)
print("JSON", json.dumps(json.loads(out.stdout)))
sys.exit(subprocess.run([sys.executable, "-m", "gpuwarden", "status"]).returncode)
"""


def test_processes_outside_every_lease_are_marked(sim, cli) -> None:
    sim("server-8xa100")
    plain = cli("status")
    assert "*" not in plain.stdout  # no lease on the machine: nothing to tell apart
    out = cli("run", "--gpus", "7", "--", sys.executable, "-c", JOB)
    assert out.returncode == 0, out.stderr
    lines = [line.split() for line in out.stdout.splitlines()]
    rows = {w[0]: " ".join(w) for w in lines if w and w[0].isdigit()}
    assert "me(1024MiB)" in rows["7"] and "me(1024MiB)*" not in rows["7"]  # under the lease
    assert ")*" in rows["4"]  # bob's notebook: no lease
    assert "unreserved use" in out.stdout
    data = json.loads(next(x for x in out.stdout.splitlines() if x.startswith("JSON "))[5:])
    marked = {g["index"]: g["unleased_pids"] for g in data["gpus"]}
    assert marked[7] == [] and len(marked[4]) == 1 and marked[6] == []


class _Lease:
    def __init__(self, pid: int) -> None:
        self.pid = pid


def test_a_process_belongs_to_a_lease_through_its_ancestry() -> None:
    procs = tuple(GpuProcess(pid=p, used_memory=1) for p in (10, 11, 20))
    gpu = Gpu(index=0, uuid="GPU-0", processes=procs)
    tree = {10: (10, 5), 11: (11, 10, 5), 20: (20, 1)}
    assert unleased_pids(gpu, [_Lease(5)], lambda p: tree[p]) == {20}
    assert unleased_pids(gpu, [], lambda p: tree[p]) == {10, 11, 20}
