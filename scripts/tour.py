"""A short scripted tour of gpuwarden on the bundled simulated 8-GPU server.

Every step is a real `gpuwarden` command, printed before it runs. The tour
keeps its simulated machine, leases and drains in a temporary directory, so
it never touches the real ones and can be run again and again. Run as root, it
ends with the queue service (`gpuwarden serve`) on its own socket there.

    python scripts/tour.py            # the simulated server-8xa100
    python scripts/tour.py --real     # read-only look at this machine's real GPUs
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

BIN = str(Path(sys.executable).parent)


def say(text: str) -> None:
    print(f"\n\033[1m## {text}\033[0m", flush=True)


def show(args: list[str]) -> None:
    print("$ " + " ".join(shlex.quote(a) for a in args), flush=True)


def gw(*args: str, env: dict[str, str], check: bool = False, cwd: str | None = None) -> int:
    """Run `gpuwarden ARGS` in the foreground, printing the command first."""
    show(["gpuwarden", *args])
    rc = subprocess.call([sys.executable, "-m", "gpuwarden", *args], env=env, cwd=cwd)
    if check and rc != 0:
        raise SystemExit(f"tour: `gpuwarden {' '.join(args)}` exited {rc}")
    return rc


def start(*args: str, env: dict[str, str]) -> subprocess.Popen[bytes]:
    """Start `gpuwarden ARGS` in the background, as a second terminal would."""
    show(["gpuwarden", *args, "&"])
    return subprocess.Popen([sys.executable, "-m", "gpuwarden", *args], env=env)


def job(name: str, seconds: int, mem: str) -> list[str]:
    """A stand-in training job: says which GPU it got, then uses it for a while."""
    script = (
        f'echo "  [{name}] started on CUDA_VISIBLE_DEVICES=$CUDA_VISIBLE_DEVICES '
        f'(CUDA_DEVICE_ORDER=$CUDA_DEVICE_ORDER)"; '
        f"exec gpuwarden sim occupy --mem {mem} --util 95 -- sleep {seconds}"
    )
    return ["sh", "-c", script]


def wait_until(count_code: str, minimum: int, what: str, env: dict[str, str]) -> None:
    """Block until a Python expression counts `minimum` things, so steps happen in order."""
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        counted = subprocess.run(
            [sys.executable, "-c", f"print({count_code})"], env=env, capture_output=True, text=True
        )
        if counted.returncode != 0:  # a count that cannot be made is the tour's bug: say it
            raise SystemExit(f"tour: counting {what} failed: {counted.stderr.strip()}")
        out = counted.stdout.strip()
        if out.isdigit() and int(out) >= minimum:
            return
        time.sleep(0.2)
    raise SystemExit(f"tour: expected {what} within 20s")


LEASES = "len(__import__('gpuwarden.leases').leases.list_leases())"
DRAINS = "len(__import__('gpuwarden.health.drain').health.drain.list_drains())"


def machine_env(spec: str, sim_state: Path, work: Path, **more: str) -> dict[str, str]:
    """This environment pointed at simulated machine `spec`, with its leases and state
    under `work`: nothing real is read or changed. The queue service's socket is one
    under `work` too (none unless `more` names one a tour step starts), so a service
    running on this machine never receives the tour's jobs."""
    env = dict(os.environ)
    env.update(
        GPUWARDEN_SIM=spec,
        GPUWARDEN_SIM_STATE=str(sim_state),
        GPUWARDEN_LEASE_DIR=str(work / "leases"),
        GPUWARDEN_STATE_DIR=str(work / "state"),
        GPUWARDEN_SOCKET=str(work / "no-service.sock"),
        PATH=BIN + os.pathsep + env.get("PATH", ""),
    )
    env.update(more)
    env.pop("CUDA_VISIBLE_DEVICES", None)
    env.pop("CUDA_DEVICE_ORDER", None)
    return env


def simulated(base: Path) -> None:
    env = machine_env("server-8xa100", base / "sim", base)

    say("A shared 8xA100 server (simulated): alice, bob and carol are already training")
    gw("status", env=env, check=True)

    say("Two jobs start at the same moment and get different, idle GPUs")
    job_a = start("run", "-g", "1", "--", *job("job A", 6, "40GiB"), env=env)
    job_b = start("run", "-g", "1", "--", *job("job B", 12, "20GiB"), env=env)
    wait_until(LEASES, 2, "two leases", env)
    time.sleep(0.5)
    gw("status", env=env, check=True)

    say("GPU 4 misbehaves: drain it so that nothing is scheduled there")
    gw("drain", "4", "--reason", "fan noise reported by bob", env=env, check=True)

    say("Asking for all 8 GPUs explains at once why that cannot be met")
    gw("run", "-g", "8", "--dry-run", "--", "python", "train.py", env=env)

    say("A third job waits its turn, and is admitted when job A ends")
    job_c = start("run", "-g", "1", "--wait", "--", *job("job C", 1, "10GiB"), env=env)
    for proc in (job_a, job_c, job_b):
        proc.wait()
    print("  all three jobs finished; their GPUs were freed when they exited")
    gw("undrain", "4", env=env, check=True)

    say("The health watch hears a fatal XID on GPU 7 and drains it automatically")
    watch = start("health", "--watch", env=env)
    time.sleep(2)  # let it register for NVML's XID events, as a service would be
    gw("sim", "inject", "xid", "79", "--gpu", "7", env=env, check=True)
    wait_until(DRAINS, 1, "an automatic drain", env)
    watch.terminate()
    watch.wait()
    gw("health", env=env)
    gw("run", "-g", "8", "--dry-run", "--", "python", "train.py", env=env)

    say("Afterwards: drains with their reasons, and no leases left behind")
    gw("status", env=env, check=True)

    say("The doctor explains this machine's environment problems")
    gw("doctor", env=env)

    say("The same view, live in a browser, for everyone in the lab")
    print(
        "  GPUWARDEN_SIM=server-8xa100 .venv/bin/gpuwarden web   # then open http://127.0.0.1:9500/"
    )


def real() -> None:
    env = dict(os.environ)
    say("This machine's GPUs (read-only: nothing is reserved or drained)")
    gw("status", env=env, check=True)
    gw("visible", env=env)
    gw("health", env=env)
    gw("doctor", env=env)


def wait_for_queue(
    done: Callable[[list[dict[str, Any]]], bool], what: str, env: dict[str, str], cwd: str
) -> None:
    """Block until `done(jobs)` holds for `gpuwarden queue --json`, so steps happen in order."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        listed = subprocess.run(
            [sys.executable, "-m", "gpuwarden", "queue", "--json"],
            env=env,
            capture_output=True,
            text=True,
            cwd=cwd,
        ).stdout
        if listed.strip() and done(json.loads(listed)):
            return
        time.sleep(0.1)
    raise SystemExit(f"tour: expected {what} within 30s")


def shared_queue(base: Path) -> None:
    """The queue service on a simulated 3-GPU workstation: one queue for every user,
    backfill, history. Only root may start the service (it runs each job as the user
    who submitted it), so the tour shows it when run as root."""
    say("One queue for the whole lab: the queue service (`gpuwarden serve`)")
    if os.geteuid() != 0:
        print("  (the service runs each job as its submitter, so starting it takes root:")
        print("   run the tour as root to see this part; docs/service.md describes it)")
        return
    work = base / "queue"
    (work / "leases").mkdir(parents=True, mode=0o755)  # the service's own, as `install` makes
    socket = str(work / "gpuwarden.sock")
    env = machine_env("workstation-3x3090", base / "sim-queue", work, GPUWARDEN_SOCKET=socket)
    print("  a workstation with three RTX 3090s; dave trains on GPU 1 outside any queue")
    service = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "gpuwarden",
            "serve",
            "--socket",
            socket,
            "--state-dir",
            str(work / "service"),
            "--log-level",
            "error",
        ],
        env=env,
    )
    show(["gpuwarden", "serve", "--socket", socket, "&"])
    try:
        from gpuwarden.queueclient.probe import wait_until_running

        if not wait_until_running(socket, 20, alive=lambda: service.poll() is None)["running"]:
            raise SystemExit("tour: the queue service did not start")
        gw("service", "status", "--socket", socket, env=env, check=True)
        cwd = str(work)  # the jobs' output files (gpuwarden-ID.out) go here
        long_job = ["sh", "-c", "echo training; sleep 5; echo saved"]
        gw("submit", "-g", "1", "--time", "1m", "--", *long_job, env=env, check=True, cwd=cwd)
        gw(
            "submit",
            "-g",
            "2",
            "--",
            "sh",
            "-c",
            "echo two GPUs: $CUDA_VISIBLE_DEVICES",
            env=env,
            check=True,
            cwd=cwd,
        )
        gw(
            "submit",
            "-g",
            "1",
            "--time",
            "5s",
            "--",
            "sh",
            "-c",
            "echo quick; sleep 2",
            env=env,
            check=True,
            cwd=cwd,
        )
        running = {"1", "3"}
        wait_for_queue(
            lambda jobs: {str(j["id"]) for j in jobs if j["state"] == "RUNNING"} == running,
            "jobs 1 and 3 to run",
            env,
            cwd,
        )
        print("  job 2 needs two GPUs: it waits for job 1's, due within its minute; job 3")
        print("  declared 5 s, ends before that, and starts now on the idle GPU (backfill)")
        gw("queue", env=env, check=True, cwd=cwd)
        gw("status", env=env, check=True, cwd=cwd)
        wait_for_queue(lambda jobs: not jobs, "every job to end", env, cwd)  # 2 after 1
        gw("jobs", env=env, check=True, cwd=cwd)
        gw("logs", "2", env=env, check=True, cwd=cwd)
        print("  fair share: each user's GPU-seconds, decayed over a week, order the queue;")
        print("  dave's use of GPU 1 outside the queue counts as his usage too")
        gw("share", env=env, check=True, cwd=cwd)
    finally:
        service.terminate()
        service.wait()


def main() -> int:
    if "--real" in sys.argv[1:]:
        real()
        return 0
    with tempfile.TemporaryDirectory(prefix="gpuwarden-tour-") as base:
        simulated(Path(base))
        shared_queue(Path(base))
    print("\n" + hint())
    return 0


def hint() -> str:
    """What to type next, in a fresh shell: gpuwarden lives in the virtual environment
    the demo made, which is not on PATH until it is activated."""
    activate = Path(sys.prefix) / "bin" / "activate"
    if sys.prefix != sys.base_prefix and activate.exists():
        near = os.path.relpath(activate)
        where = near if not near.startswith("..") else str(activate)
        first = f"source {shlex.quote(where)}   # gpuwarden is installed here, not on PATH"
    else:
        first = "python3 -m pip install -e .   # or put gpuwarden on PATH another way"
    return "\n".join(
        [
            "Done. Try it yourself in a new shell:",
            f"  {first}",
            '  eval "$(gpuwarden sim env server-8xa100)"   # this shell sees the simulated server',
            "  gpuwarden status",
            "The demo installs gpuwarden alone; ./scripts/test installs torch and the test",
            "extras (prometheus-client, ...) into the same .venv and runs the tests.",
        ]
    )


if __name__ == "__main__":
    raise SystemExit(main())
