"""A short scripted tour of gpuwarden on the bundled simulated 8-GPU server.

Every step is a real `gpuwarden` command, printed before it runs. The tour
keeps its simulated machine, leases and drains in a temporary directory, so
it never touches the real ones and can be run again and again.

    python scripts/tour.py            # the simulated server-8xa100
    python scripts/tour.py --real     # read-only look at this machine's real GPUs
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BIN = str(Path(sys.executable).parent)


def say(text: str) -> None:
    print(f"\n\033[1m## {text}\033[0m", flush=True)


def show(args: list[str]) -> None:
    print("$ " + " ".join(shlex.quote(a) for a in args), flush=True)


def gw(*args: str, env: dict[str, str], check: bool = False) -> int:
    """Run `gpuwarden ARGS` in the foreground, printing the command first."""
    show(["gpuwarden", *args])
    rc = subprocess.call([sys.executable, "-m", "gpuwarden", *args], env=env)
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
        out = subprocess.run(
            [sys.executable, "-c", f"print({count_code})"], env=env, capture_output=True, text=True
        ).stdout.strip()
        if out.isdigit() and int(out) >= minimum:
            return
        time.sleep(0.2)
    raise SystemExit(f"tour: expected {what} within 20s")


LEASES = "len(__import__('gpuwarden.leases').leases.list_leases())"
DRAINS = "len(__import__('gpuwarden.drain').drain.list_drains())"


def simulated(base: Path) -> None:
    env = dict(os.environ)
    env.update(
        GPUWARDEN_SIM="server-8xa100",
        GPUWARDEN_SIM_STATE=str(base / "sim"),
        GPUWARDEN_LEASE_DIR=str(base / "leases"),
        GPUWARDEN_STATE_DIR=str(base / "state"),
        PATH=BIN + os.pathsep + env.get("PATH", ""),
    )
    env.pop("CUDA_VISIBLE_DEVICES", None)
    env.pop("CUDA_DEVICE_ORDER", None)

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
    print("  GPUWARDEN_SIM=server-8xa100 .venv/bin/gpuwarden web   # then open http://127.0.0.1:9500/")


def real() -> None:
    env = dict(os.environ)
    say("This machine's GPUs (read-only: nothing is reserved or drained)")
    gw("status", env=env, check=True)
    gw("visible", env=env)
    gw("health", env=env)
    gw("doctor", env=env)


def main() -> int:
    if "--real" in sys.argv[1:]:
        real()
        return 0
    with tempfile.TemporaryDirectory(prefix="gpuwarden-tour-") as base:
        simulated(Path(base))
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
