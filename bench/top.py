"""`gpuwarden top`'s cost, beside nvitop's full-screen mode, on the simulated server-8xa100.

* redraw: `top.screen.draw` of the 8 GPUs and 1,000 queued jobs (8 running, 992
  waiting, rows as the queue service lists them), at 80×24 and 200×60, CPU time in
  this process (target: <= 50 ms);
* one reading (`lab.read_lab`: the GPUs, leases and drains) without a service, and,
  as root, with a real `gpuwarden serve` holding --jobs jobs (what each refresh costs);
* idle CPU: `gpuwarden top` and `nvitop` each in a tmux window of 80×24 for --seconds,
  at each one's default refresh (2 s), as percent of one core (target: <= 1%); with the
  service (root) holding 1,000 jobs, `top` reads at every refresh the rows its screen
  needs (`top.model.wanted_rows`: a page below the last row shown).

Run: .venv/bin/python bench/top.py [--runs 50] [--seconds 30] [--jobs 1000]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil

ROOT = Path(__file__).resolve().parent.parent
SPEC = "server-8xa100"


def queue_rows(count: int, now: float) -> list[dict[str, Any]]:
    """`count` jobs as the service lists them: 8 running on a GPU each, the rest waiting."""
    rows = []
    for n in range(1, count + 1):
        running = n <= 8
        rows.append(
            {
                "id": n,
                "user": f"user{n % 7}",
                "state": "RUNNING" if running else "PENDING",
                "count": 1,
                "gpus": [f"GPU-{n}"] if running else [],
                "indices": [n - 1] if running else [],
                "reason": None if running else "Resources",
                "submitted": now - 3600 + n,
                "started": now - 600 if running else None,
                "time_limit": 7200.0,
                "held": False,
                "after": [],
                "priority": None if running else 1000.0 - n / 10,
                "estimated_start": None if running else now + n * 60,
                "command": ["python", "train.py", f"--seed={n}"],
            }
        )
    return rows


def cpu_ms(call: Any, runs: int) -> list[float]:
    out = []
    for _ in range(runs):
        t0 = time.process_time()
        call()
        out.append((time.process_time() - t0) * 1000)
    return out


def show(values: list[float]) -> str:
    values = sorted(values)
    return f"median {statistics.median(values):.2f} ms, max {values[-1]:.2f} ms"


def redraw(runs: int, jobs: int) -> None:
    from gpuwarden.lab.reading import read_lab
    from gpuwarden.top.model import State
    from gpuwarden.top.screen import draw

    now = time.time()
    lab = read_lab("/nonexistent")
    lab = type(lab)(**{**lab.__dict__, "jobs": queue_rows(jobs, now), "user": "user1"})
    print(f"{len(lab.gpus)} GPUs, {len(lab.jobs)} jobs")
    for width, height in ((80, 24), (200, 60)):
        spent = cpu_ms(lambda w=width, h=height: draw([lab], State(), w, h, now), runs)
        print(f"redraw at {width}x{height}: {show(spent)} (target <= 50 ms)")
    spent = cpu_ms(lambda: draw([lab], State(mine=True, sort="user"), 80, 24, now), runs)
    print(f"redraw at 80x24, only mine, sorted by user: {show(spent)}")


def reading(runs: int, socket: str | None) -> None:
    from gpuwarden.lab.reading import read_lab
    from gpuwarden.top.model import State, wanted_rows

    for rows in (None, wanted_rows(State(), 24)) if socket else (None,):
        read_lab(socket or "/nonexistent", rows=rows)
        spent = cpu_ms(lambda n=rows: read_lab(socket or "/nonexistent", rows=n), runs)
        lab = read_lab(socket or "/nonexistent", rows=rows)
        what = f"{len(lab.jobs)} of the service's {lab.total} jobs" if socket else "no service"
        print(f"one reading ({what}): {show(spent)} CPU in this process")


def idle(name: str, command: list[str], seconds: float, env: dict[str, str]) -> float:
    """Percent of a core `command` (and its children) used in a tmux window of 80×24."""
    folder = tempfile.mkdtemp(prefix="gw-bench-top-")
    sock = os.path.join(folder, "tmux.sock")
    tmux = ["tmux", "-S", sock, "-f", "/dev/null"]
    argv = ["env", "-i", *(f"{k}={v}" for k, v in env.items()), *command]
    subprocess.run(
        [*tmux, "new-session", "-d", "-s", "b", "-x", "80", "-y", "24", *argv], check=True
    )
    try:
        pid = int(
            subprocess.run(
                [*tmux, "display", "-p", "-t", "b", "#{pane_pid}"],
                capture_output=True,
                text=True,
                check=True,
            ).stdout
        )
        proc = psutil.Process(pid)
        time.sleep(5)  # started, first screen drawn
        tree = [proc, *proc.children(recursive=True)]
        before = sum(sum(p.cpu_times()[:2]) for p in tree)
        started = time.monotonic()
        time.sleep(seconds)
        after = sum(sum(p.cpu_times()[:2]) for p in tree)
        screen = subprocess.run(
            [*tmux, "capture-pane", "-p", "-t", "b"], capture_output=True, text=True
        ).stdout
        if "80G" not in screen and "80.00GiB" not in screen:
            print(f"{name}: the screen shows no GPU:\n{screen}")
        return 100.0 * (after - before) / (time.monotonic() - started)
    finally:
        subprocess.run([*tmux, "kill-server"], capture_output=True)
        shutil.rmtree(folder, ignore_errors=True)


def with_service(tmp: Path, jobs: int) -> tuple[subprocess.Popen[bytes], str]:
    from gpuwarden.queueclient.client import connect

    sock, state = str(tmp / "service.sock"), str(tmp / "service")
    service = subprocess.Popen(
        [sys.executable, "-m", "gpuwarden", "serve", "--socket", sock, "--state-dir", state],
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 30
    while not os.path.exists(sock):
        if service.poll() is not None or time.monotonic() > deadline:
            raise SystemExit("gpuwarden serve did not start")
        time.sleep(0.05)
    client = connect(sock)
    assert client is not None
    with client:
        for _ in range(jobs):
            client.call(
                "submit",
                argv=["sleep", "3600"],
                cwd=str(tmp),
                env={"PATH": "/usr/bin:/bin"},
                request={"count": 1},
                output=os.devnull,
            )
    return service, sock


def main() -> int:
    from conditions import bytecode

    bytecode()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=50)
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--jobs", type=int, default=1000)
    args = parser.parse_args()
    os.environ.setdefault("GPUWARDEN_SIM", SPEC)
    tmp = Path(tempfile.mkdtemp(prefix="gw-bench-top-"))
    tmp.chmod(0o755)
    os.environ["GPUWARDEN_SIM_STATE"] = str(tmp / "sim")
    redraw(args.runs, args.jobs)
    reading(args.runs, None)
    service, sock = None, None
    if os.geteuid() == 0:
        service, sock = with_service(tmp, args.jobs)
        reading(args.runs, sock)
    else:
        print("queue service: skipped (`gpuwarden serve` runs as root only)")
    env = {
        "PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin",
        "TERM": "screen",
        "GPUWARDEN_SIM": SPEC,
        "GPUWARDEN_SIM_STATE": os.environ["GPUWARDEN_SIM_STATE"],
        "PYTHONPATH": f"{ROOT / 'src/gpuwarden/sim/shim'}:{ROOT / 'src'}",
        "HOME": str(tmp),
    }
    # The bench's own service, or none: never a service this machine runs for its users.
    env["GPUWARDEN_SOCKET"] = sock or str(tmp / "no-service.sock")
    try:
        ours = idle("gpuwarden top", [sys.executable, "-m", "gpuwarden", "top"], args.seconds, env)
        nvitop = shutil.which("nvitop", path=str(Path(sys.executable).parent))
        peer = idle("nvitop", [nvitop], args.seconds, env) if nvitop else None
    finally:
        if service is not None:
            from gpuwarden.queueclient.client import connect

            with connect(sock) as client:  # type: ignore[union-attr]
                rows, _ = client.listing("queue")
                client.call("cancel", jobs=[r["id"] for r in rows][:1024])
            service.terminate()
            service.wait(30)
        shutil.rmtree(tmp, ignore_errors=True)
    print(
        f"idle CPU, 80x24 in tmux, default refresh: gpuwarden top {ours:.2f}% of a core "
        "(target <= 1%)" + ("" if not sock else f", with {args.jobs} jobs in the queue")
    )
    if peer is not None:
        print(
            f"idle CPU, nvitop full-screen: {peer:.2f}% of a core; ratio top/nvitop "
            f"{ours / peer:.2f}x"
            if peer
            else "nvitop: no CPU measured"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
