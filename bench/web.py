"""Web page cost: the data endpoint's latency and what open pages cost the server.

On the simulated server-8xa100 with 64 extra GPU processes (8 per GPU), against
a real `gpuwarden web` process (health watch on, one update a second), loopback only:

* `/api/v1/state` latency (median, p99) over one keep-alive connection, and
  over a new connection per request (target: median <= 5 ms);
* the cost of building one document (what the shared feed does once a second,
  however many pages are open), measured in this process;
* server CPU while idle and while 50 pages follow `/api/v1/events` (one update a
  second each): the difference is what the pages cost (target < 2% of a core);
* then the same latency and build cost with a real queue service (`gpuwarden
  serve`, root only) holding `--jobs` jobs (8 running, the rest waiting), which
  the page asks once a second (target: median <= 5 ms).

Run: .venv/bin/python bench/web.py [--requests 300] [--cpu-seconds 20] [--pages 50] [--jobs 50]
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import selectors
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_up(port: int, proc: subprocess.Popen, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"gpuwarden web exited: {proc.stderr.read() if proc.stderr else ''}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return
        except OSError:
            time.sleep(0.2)
    raise SystemExit(f"port {port} did not open in {timeout}s")


def ms(values: list[float]) -> str:
    values = sorted(values)
    p99 = values[min(len(values) - 1, int(len(values) * 0.99))]
    return f"median {statistics.median(values) * 1000:.2f} ms, p99 {p99 * 1000:.2f} ms"


def latency(port: int, requests: int, keep_alive: bool) -> list[float]:
    times = []
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    for _ in range(requests):
        if not keep_alive:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        started = time.perf_counter()
        conn.request("GET", "/api/v1/state")
        reply = conn.getresponse()
        body = reply.read()
        times.append(time.perf_counter() - started)
        assert reply.status == 200 and body.startswith(b"{"), reply.status
        if not keep_alive:
            conn.close()
    conn.close()
    return times


def build_cost(runs: int, service: str | None = None) -> list[float]:
    from gpuwarden.web.server import Feed

    feed = Feed(service=service)
    feed.document()
    times = []
    for _ in range(runs):
        started = time.perf_counter()
        feed.sample()
        times.append(time.perf_counter() - started)
    return times


def cpu_share(proc: psutil.Process, seconds: float) -> float:
    """Percent of one core the process used over `seconds`."""
    before = proc.cpu_times()
    started = time.monotonic()
    time.sleep(seconds)
    after = proc.cpu_times()
    used = (after.user - before.user) + (after.system - before.system)
    return 100.0 * used / (time.monotonic() - started)


def follow(port: int, pages: int, seconds: float, proc: psutil.Process) -> tuple[float, int]:
    """Open `pages` event streams, read them for `seconds`; (server CPU %, events read)."""
    sel = selectors.DefaultSelector()
    socks = []
    for _ in range(pages):
        s = socket.create_connection(("127.0.0.1", port), timeout=10)
        s.sendall(b"GET /api/v1/events HTTP/1.1\r\nHost: localhost\r\n\r\n")
        s.setblocking(False)
        sel.register(s, selectors.EVENT_READ)
        socks.append(s)
    events = 0
    before = proc.cpu_times()
    started = time.monotonic()
    while time.monotonic() - started < seconds:
        for key, _ in sel.select(timeout=0.5):
            data = key.fileobj.recv(1 << 20)  # type: ignore[union-attr]
            events += data.count(b"\ndata: ") + data.startswith(b"data: ")
    after = proc.cpu_times()
    elapsed = time.monotonic() - started
    for s in socks:
        s.close()
    used = (after.user - before.user) + (after.system - before.system)
    return 100.0 * used / elapsed, events


def with_service(tmp: Path, jobs: int, requests: int) -> subprocess.Popen:
    """The latency again, with a queue service of `jobs` jobs that the page asks once a
    second; returns the page's process (the caller stops it)."""
    from gpuwarden.queueclient.client import connect

    sock, state = str(tmp / "service.sock"), str(tmp / "service")
    # A machine of its own, without the 64 processes above: GPUs the queue can hand out.
    os.environ["GPUWARDEN_SIM_STATE"] = str(tmp / "sim-queue")
    service = subprocess.Popen(
        [sys.executable, "-m", "gpuwarden", "serve", "--socket", sock, "--state-dir", state],
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 30
        while not os.path.exists(sock):
            if service.poll() is not None or time.monotonic() > deadline:
                raise SystemExit("gpuwarden serve did not start")
            time.sleep(0.05)
        client = connect(sock)
        assert client is not None
        ids = []
        with client:
            for _ in range(jobs):
                reply = client.call(
                    "submit",
                    argv=["sleep", "3600"],
                    cwd=str(tmp),
                    env={"PATH": "/usr/bin:/bin"},
                    request={"count": 1},
                    output=os.devnull,
                )
                ids.append(reply["job"])
            deadline = time.monotonic() + 10  # let the service start what fits
            while True:
                rows = client.call("queue")["jobs"]
                running = sum(r["state"] == "RUNNING" for r in rows)
                if running or time.monotonic() > deadline:
                    break
                time.sleep(0.1)
        port = free_port()
        page = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "gpuwarden",
                "web",
                "--listen",
                f"127.0.0.1:{port}",
                "--socket",
                sock,
            ],
            stderr=subprocess.PIPE,
            text=True,
        )
        wait_up(port, page)
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        conn.request("GET", "/api/v1/state")
        queue = json.loads(conn.getresponse().read())["queue"]
        conn.close()
        listed = len(queue["running"]) + len(queue["waiting"])
        print(
            f"with a queue service of {len(rows)} jobs ({running} running; {listed} on the page):"
        )
        print(f"/api/v1/state keep-alive ({requests}): {ms(latency(port, requests, True))}")
        print(f"building one document with the service's answers: {ms(build_cost(50, sock))}")
        with connect(sock) as client:  # type: ignore[union-attr]
            client.call("cancel", jobs=ids)
        return page
    finally:
        service.terminate()
        service.wait(30)


def main() -> int:
    from conditions import bytecode

    bytecode()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=300)
    parser.add_argument("--cpu-seconds", type=float, default=20.0)
    parser.add_argument("--pages", type=int, default=50)
    parser.add_argument("--jobs", type=int, default=50, help="jobs in the queue service (0: none)")
    args = parser.parse_args()
    if not (1 <= args.requests <= 100_000 and 1 <= args.cpu_seconds <= 600):
        raise SystemExit("--requests 1..100000, --cpu-seconds 1..600")
    if not 0 <= args.jobs <= 10_000:
        raise SystemExit("--jobs 0..10000")

    tmp = Path(tempfile.mkdtemp(prefix="gpuwarden-bench-web-"))
    os.environ.update(
        GPUWARDEN_SIM="server-8xa100",
        GPUWARDEN_SIM_STATE=str(tmp / "sim"),
        GPUWARDEN_LEASE_DIR=str(tmp / "leases"),
        GPUWARDEN_STATE_DIR=str(tmp / "state"),
        PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT / "src"), os.environ.get("PYTHONPATH")])),
    )
    sys.path.insert(0, str(ROOT / "src"))
    from gpuwarden.sim import Machine

    machine = Machine.open()
    sleepers = [subprocess.Popen(["sleep", "3600"]) for _ in range(64)]
    server = None
    try:
        for n, sleeper in enumerate(sleepers):
            machine.add_process(
                n % 8, sleeper.pid, "64MiB", user=f"user{n % 5}", command=f"python job{n}.py"
            )
        port = free_port()
        server = subprocess.Popen(
            [sys.executable, "-m", "gpuwarden", "web", "--listen", f"127.0.0.1:{port}"],
            stderr=subprocess.PIPE,
            text=True,
        )
        wait_up(port, server)
        proc = psutil.Process(server.pid)
        print("server-8xa100 (simulated), 64 extra processes, gpuwarden web (watch on, 1 s)")
        print(
            f"/api/v1/state keep-alive ({args.requests}): {ms(latency(port, args.requests, True))}"
        )
        print(f"/api/v1/state new connection: {ms(latency(port, args.requests, False))}")
        print(f"building one document (once a second, shared): {ms(build_cost(50))}")
        idle = cpu_share(proc, args.cpu_seconds)
        busy, events = follow(port, args.pages, args.cpu_seconds, proc)
        print(f"server CPU idle: {idle:.2f}% of a core")
        print(
            f"server CPU with {args.pages} pages following events: {busy:.2f}% "
            f"({events} events read); the pages cost {busy - idle:.2f}% (target < 2%)"
        )
        if args.jobs and os.geteuid() != 0:
            print("queue service: skipped (`gpuwarden serve` runs as root only)")
        elif args.jobs:
            server.terminate()
            server.wait(10)
            server = with_service(tmp, args.jobs, args.requests)
    finally:
        if server is not None:
            server.terminate()
            server.wait(10)
        for sleeper in sleepers:
            sleeper.kill()
            sleeper.wait()
    return 0


if __name__ == "__main__":
    sys.exit(main())
