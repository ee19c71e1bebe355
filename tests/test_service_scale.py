"""A submit costs the same into a long queue as into an empty one.

The real service (`python -m gpuwarden serve`, as root, on the simulated four
A100s) is filled with 2,000 held jobs; the median submit then must stay within
2x of the empty queue's, measured the same way in the same run, and the
scheduling passes are coalesced, not one per submit. bench/service_scale.py
measures the same at 10,000 pending, beside Slurm.
"""

from __future__ import annotations

import os
import signal
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpuwarden.service import protocol
from gpuwarden.service.probe import wait_until_running

SRC = str(Path(__file__).resolve().parent.parent / "src")
SPEC = str(Path(__file__).resolve().parent / "data" / "idle-4xa100.toml")
SERVE = [sys.executable, "-m", "gpuwarden", "serve", "--log-level", "WARNING"]
PENDING = 2000
SAMPLES = 150


class Raw:
    """One connection, requests pipelined (filling) or one at a time (measuring)."""

    def __init__(self, path: str) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.connect(path)
        self.sock.settimeout(60)
        self.decoder = protocol.Decoder()
        self.replies: list[dict[str, Any]] = []

    def send(self, op: str, **fields: Any) -> None:
        self.sock.sendall(protocol.encode({"v": protocol.VERSION, "op": op, **fields}))

    def receive(self) -> dict[str, Any]:
        while not self.replies:
            data = self.sock.recv(1 << 20)
            assert data, "the service closed the connection"
            self.replies.extend(self.decoder.feed(data))
        reply = self.replies.pop(0)
        assert reply.get("ok"), reply
        return reply

    def call(self, op: str, **fields: Any) -> dict[str, Any]:
        self.send(op, **fields)
        return self.receive()


def held(work: Path) -> dict[str, Any]:
    return {
        "argv": ["true"],
        "cwd": str(work),
        "env": {"PATH": "/usr/bin:/bin"},
        "output": "/dev/null",
        "request": {"count": 1},
        "hold": True,
    }


@pytest.fixture
def service(tmp_path: Path) -> Iterator[Raw]:
    sock = str(tmp_path / "gw.sock")
    env = dict(
        os.environ,
        PYTHONPATH=SRC,
        GPUWARDEN_SIM=SPEC,
        GPUWARDEN_SIM_STATE=str(tmp_path / "sim"),
        GPUWARDEN_LEASE_DIR=str(tmp_path / "leases"),
    )
    with open(tmp_path / "serve.log", "ab") as log:
        proc = subprocess.Popen(
            [*SERVE, "--socket", sock, "--state-dir", str(tmp_path / "state")],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    try:
        found = wait_until_running(sock, 30, alive=lambda: proc.poll() is None)
        assert found["running"], found["error"]
        raw = Raw(sock)
        yield raw
        raw.sock.close()
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(30)


def median_submit(raw: Raw, work: Path) -> float:
    times = []
    for _ in range(SAMPLES):
        t0 = time.perf_counter()
        raw.call("submit", **held(work))
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def test_a_submit_into_2000_waiting_jobs_costs_what_one_into_an_empty_queue_does(
    service: Raw, tmp_path: Path
) -> None:
    median_submit(service, tmp_path)  # warm: imports and the first pass are behind us
    empty = median_submit(service, tmp_path)
    for _ in range(PENDING // 100):  # pipelined, 100 at a time: filling is not measured
        for _ in range(100):
            service.send("submit", **held(tmp_path))
        for _ in range(100):
            service.receive()
    passes = service.call("stats")["plan"]["count"]
    full = median_submit(service, tmp_path)
    after = service.call("stats")["plan"]
    assert full <= 2 * empty, f"{full * 1000:.2f} ms at {PENDING} pending, {empty * 1000:.2f} empty"
    # Coalesced: far fewer passes than submits, yet the queue's reasons stay current.
    assert after["count"] - passes < SAMPLES / 4, after
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        rows = service.call("queue")["jobs"]
        if all(r["reason"] == "Held" for r in rows):
            break
        time.sleep(0.1)
    assert {r["reason"] for r in rows} == {"Held"}
    assert len(rows) == PENDING + 3 * SAMPLES
