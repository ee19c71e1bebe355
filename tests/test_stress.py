"""Many concurrent `gpuwarden run -g 1 --wait` clients on the simulated 8-GPU server:
no two lease intervals on one GPU overlap, and every job runs exactly once.
(bench/stress.py runs the same check at 200 clients x 50 jobs.)"""

from __future__ import annotations

import itertools
import os
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

from repo import SRC
from waiting import wait_for

CLIENTS = 20
# Four of the eight GPUs, so that clients (which start slowly on a small CI box) queue.
RUN = [sys.executable, "-m", "gpuwarden", "run", "-g", "1", "--gpus", "4,5,6,7", "--wait"]

# The job logs its own interval with the clock it runs under. The first jobs hold their
# GPUs until every other client is waiting in line (GO), so the line is always exercised.
JOB = (
    'echo "$GPUWARDEN_GPUS $CLIENT start $(date +%s%N)" >> "$LOG"; '
    'n=0; while [ ! -e "$GO" ] && [ $n -lt 1500 ]; do sleep 0.04; n=$((n+1)); done; sleep 0.05; '
    'echo "$GPUWARDEN_GPUS $CLIENT end $(date +%s%N)" >> "$LOG"'
)


def check_log(text: str, clients: int) -> dict[str, int]:
    """Assert the log's invariants; the number of jobs per GPU."""
    starts: dict[str, tuple[str, int]] = {}
    intervals: dict[str, list[tuple[int, int, str]]] = defaultdict(list)
    ran: dict[str, int] = defaultdict(int)
    for line in text.splitlines():
        gpu, client, what, stamp = line.split()
        if what == "start":
            assert client not in starts, f"client {client} started twice"
            starts[client] = (gpu, int(stamp))
            ran[client] += 1
        else:
            g, begun = starts[client]
            assert g == gpu
            intervals[gpu].append((begun, int(stamp), client))
    assert sorted(ran) == sorted(str(i) for i in range(clients)), "a job did not run"
    assert all(n == 1 for n in ran.values())
    for gpu, spans in intervals.items():
        spans.sort()
        for (_s0, e0, c0), (s1, _e1, c1) in itertools.pairwise(spans):
            assert s1 >= e0, f"clients {c0} and {c1} overlapped on {gpu}"
    return {gpu: len(spans) for gpu, spans in intervals.items()}


def test_concurrent_waiting_clients_never_share_a_gpu(sim, tmp_path: Path) -> None:
    sim("server-8xa100")
    from gpuwarden.sim import Machine

    machine = Machine.open()
    for p in machine.state()["processes"]:
        machine.remove_process(p["pid"])
    log = tmp_path / "intervals.log"
    go = tmp_path / "go"
    env = dict(os.environ, PYTHONPATH=str(SRC), LOG=str(log), GO=str(go))
    procs = [
        subprocess.Popen(
            [*RUN, "--", "sh", "-c", JOB],
            env=dict(env, CLIENT=str(i)),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(CLIENTS)
    ]
    try:
        lease_dir = os.environ["GPUWARDEN_LEASE_DIR"]
        os.makedirs(lease_dir, mode=0o700, exist_ok=True)

        def queued() -> bool:
            assert all(p.poll() is None for p in procs), "a client ended early"
            return sum(n.endswith(".wait") for n in os.listdir(lease_dir)) >= CLIENTS - 4

        wait_for(queued, 60, "the clients queued")
        go.touch()
        waited = 0
        for p in procs:
            _, err = p.communicate(timeout=180)
            assert p.returncode == 0, err
            waited += "in line" in err
    finally:
        go.touch()  # never leave clients or their jobs behind, even when failing
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    per_gpu = check_log(log.read_text(), CLIENTS)
    assert sum(per_gpu.values()) == CLIENTS
    assert len(per_gpu) == 4
    assert waited == CLIENTS - 4
    import gpuwarden.leases as lease

    assert lease.list_leases() == []
    assert not [n for n in os.listdir(os.environ["GPUWARDEN_LEASE_DIR"]) if n.endswith(".wait")]
