"""A root queue service on the simulated four A100s, spoken to over one raw
connection: the scale and count tests pipeline thousands of requests through it and
read the service's own CPU time and counters, without a client process per request."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpuwarden.queueclient import protocol
from gpuwarden.queueclient.probe import wait_until_running

SRC = str(Path(__file__).resolve().parent.parent / "src")
SPEC = str(Path(__file__).resolve().parent / "data" / "idle-4xa100.toml")
SERVE = [sys.executable, "-m", "gpuwarden", "serve", "--log-level", "WARNING"]


class Raw:
    """One connection, requests pipelined (filling) or one at a time (measuring)."""

    def __init__(self, path: str) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.connect(path)
        self.sock.settimeout(60)
        self.decoder = protocol.Decoder()
        self.replies: list[dict[str, Any]] = []
        self.pid = 0  # the service's
        self.system = ""  # its system settings file: a client that names another steps aside

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


def cpu_ns(pid: int) -> int:
    """CPU time of every thread of `pid` so far, in nanoseconds (/proc schedstat)."""
    total = 0
    for task in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{task}/schedstat") as fh:
            total += int(fh.read().split()[0])
    return total


@pytest.fixture
def raw_service(tmp_path: Path) -> Iterator[Raw]:
    sock = str(tmp_path / "gw.sock")
    # A lab's system file, written an hour ago: the service reads it once, then again
    # only when it changes (service.liveconfig; tests/test_service_liveconfig.py).
    lab = tmp_path / "config.toml"
    lab.write_text("# the lab's settings\n")
    os.utime(lab, (time.time() - 3600, time.time() - 3600))
    env = dict(
        os.environ,
        GPUWARDEN_SYSTEM_CONFIG=str(lab),
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
        raw.pid = proc.pid
        raw.system = str(lab)
        yield raw
        raw.sock.close()
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(30)
