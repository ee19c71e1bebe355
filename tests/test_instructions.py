"""The commands paid again and again, held by the instructions they execute.

`gpuwarden status` and a CLI `submit` are whole short processes; their wall time
moves by a third within an hour on a shared machine, the instructions valgrind
counts do not (bench/status.py and bench/run_overhead.py print the same counts).
Each line is a number the commands meet now with room, and that the tree before
its submit was thinned (a submit 80 M instructions heavier) or a shell that writes
no bytecode (every module compiled again: `status` at 244 M) crosses.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from components import require
from gpuwarden.sim.fake import SHIM_DIR
from rawservice import Raw, held
from repo import SRC

BIN = Path(sys.executable).parent
# `gpuwarden status` at most this share of `nvitop -1`'s instructions (both on the
# simulated 8x A100 server): 0.37 now, 0.47 with every module compiled again.
STATUS_OF_NVITOP = 0.4
# A CLI `submit` at most this many instructions over `python -c pass`: about -1 M now
# (the short client loads eight small modules of its own and two of the interpreter's,
# tests/test_thin_submit.py, and skips the interpreter's unwinding; queueclient.thin);
# the full client it hands the command line past counted 80 M.
SUBMIT_OVER_PYTHON = 10e6
# `queue --all` over 2,000 waiting jobs at most this many instructions more than over
# an empty queue: 4 M now (the service writes the table, the client prints its
# lines: 19 M over `python -c pass` in all); 309 M when the client decoded every row
# and drew the table itself.
QUEUE_ROWS_OVER_EMPTY = 30e6


def instructions(argv: list[str], env: dict[str, str]) -> int:
    """User-space instructions of `argv`'s own process, the fewer of two runs (they
    differ only by hash seeds and timing)."""
    counts = []
    for _ in range(2):
        out = subprocess.run(
            ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null", *argv],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            timeout=300,
        )
        said = [line for line in out.stderr.splitlines() if "Collected :" in line]
        assert out.returncode == 0 and said, f"{argv}: {out.stderr[-2000:]}"
        counts.append(int(said[-1].split()[-1]))
    return min(counts)


def environment(**extra: str) -> dict[str, str]:
    """The test's environment (conftest's locations), with bytecode written and read
    as a user's shell does: without it every module is compiled again each time."""
    env = dict(os.environ, **extra)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    return env


def command(name: str) -> list[str]:
    """The console script as a user types it (the venv's), else the module."""
    script = BIN / name
    require(script.exists(), f"{script} (the test extra installs it: scripts/test)")
    return [str(script)]


def counted(argv: list[str], env: dict[str, str]) -> int:
    subprocess.run(argv, env=env, capture_output=True, timeout=120)  # bytecode written
    return instructions(argv, env)


def valgrind() -> None:
    require(shutil.which("valgrind") is not None, "valgrind (apt-get install valgrind)")


def test_status_executes_at_most_two_fifths_of_nvitop_once() -> None:
    valgrind()
    env = environment(
        GPUWARDEN_SIM="server-8xa100",
        PYTHONPATH=os.pathsep.join((SHIM_DIR, str(SRC))),
        COLUMNS="120",
    )
    ours = counted([*command("gpuwarden"), "status"], env)
    peer = counted([*command("nvitop"), "-1"], env)
    ratio = ours / peer
    said = f"status {ours / 1e6:.1f} M, nvitop -1 {peer / 1e6:.1f} M instructions: {ratio:.3f}"
    assert ratio <= STATUS_OF_NVITOP, said


def test_a_cli_submit_adds_few_instructions_to_the_interpreters_start(
    raw_service: Raw, tmp_path: Path
) -> None:
    valgrind()
    sock = str(tmp_path / "gw.sock")
    # The service's own system file, as on a lab's machine: another makes the short
    # client step aside for the full one, which reads it as the user.
    env = environment(
        PYTHONPATH=str(SRC), GPUWARDEN_SOCKET=sock, GPUWARDEN_SYSTEM_CONFIG=raw_service.system
    )
    floor = counted([sys.executable, "-c", "pass"], env)
    argv = [*command("gpuwarden"), "submit", "--hold", "-g", "1", "--", "true"]
    ours = counted(argv, env)
    over = ours - floor
    said = f"submit {ours / 1e6:.1f} M, python -c pass {floor / 1e6:.1f} M instructions"
    assert over <= SUBMIT_OVER_PYTHON, f"{said}: {over / 1e6:.1f} M over"
    listed = Raw(sock).call("queue", limit=10)  # afresh: the service drops idle clients
    assert listed["total"] == 3, listed  # each run did submit (warming, then two counted)


def test_queue_all_costs_the_client_little_more_over_2000_jobs_than_over_none(
    raw_service: Raw, tmp_path: Path
) -> None:
    valgrind()
    sock = str(tmp_path / "gw.sock")
    env = environment(PYTHONPATH=str(SRC), GPUWARDEN_SOCKET=sock, COLUMNS="200")
    argv = [*command("gpuwarden"), "queue", "--all"]
    empty = counted(argv, env)
    for _ in range(2000):
        raw_service.call("submit", **held(tmp_path))
    full = counted(argv, env)
    more = full - empty
    said = f"queue --all: {empty / 1e6:.1f} M over none, {full / 1e6:.1f} M over 2,000 jobs"
    assert more <= QUEUE_ROWS_OVER_EMPTY, said
    listed = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120)
    assert len(listed.stdout.splitlines()) == 2001, listed.stdout[-2000:]  # a line a job
