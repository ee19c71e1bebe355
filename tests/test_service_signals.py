"""Time limits and signals of the queue service's jobs, as Slurm gives them.

At its --time a job gets SIGTERM, once to each of its processes, then SIGKILL after the
service's grace; `--signal=SIG@SECONDS` sends a signal that long before the limit, to
every process of the job or (`B:`) to its first only. The real service of
tests/servicetools.py with a real user's jobs, which note each signal they get, by pid.
"""

from __future__ import annotations

import signal
from pathlib import Path

from servicetools import USER_PY, Server, submit
from users import make_user
from waiting import wait_for


def test_a_job_past_its_time_gets_term_then_kill(server: Server) -> None:
    alice = make_user("alice", ("lab",))
    polite = submit(server, alice, ["sleep", "60"], time_limit=0.5)
    stubborn = submit(server, alice, ["sh", "-c", "trap '' TERM; sleep 60"], time_limit=0.5)
    assert server.wait_state(polite, ("TIMEOUT",))["signal"] == signal.SIGTERM
    assert server.wait_state(stubborn, ("TIMEOUT",), timeout=30)["signal"] == signal.SIGKILL


#: A job of three processes (sh, and two children) that notes each SIGTERM or USR1 each
#: of them gets, by pid, and keeps running: only SIGKILL ends it.
COUNTING = (
    "import os, signal, sys, time\n"
    "log = sys.argv[1]\n"
    "def note(n, _f):\n"
    "    with open(log, 'a') as f: f.write(f'{os.getpid()} {n}\\n')\n"
    "signal.signal(signal.SIGTERM, note)\n"
    "signal.signal(signal.SIGUSR1, note)\n"
    "role = 'up'\n"
    "for _ in range(2):\n"
    "    if os.fork() == 0: break\n"
    "else: role = 'up-first'\n"
    "with open(log, 'a') as f: f.write(f'{os.getpid()} {role}\\n')\n"
    "while True: time.sleep(0.01)\n"
)


def _noted(path: Path, count: int, timeout: float = 30) -> list[str]:
    """The lines of a COUNTING job's log once there are at least `count`."""

    def lines() -> list[str]:
        return path.read_text().splitlines() if path.exists() else []

    def enough() -> list[str]:
        got = lines()
        return got if len(got) >= count else []

    return wait_for(enough, timeout, lambda: f"{count} lines in {path}: {lines() or 'no log'}")


def test_at_its_time_limit_each_process_gets_one_sigterm_then_sigkill(server: Server) -> None:
    """Issue 23: SIGTERM went through the cgroup and the process group, so twice to
    each process; a job that takes a second one for "abort now" lost its checkpoint."""
    alice = make_user("alice", ("lab",))
    log = server.work / "terms.log"
    # Long enough for its handlers to be in place on a loaded machine.
    job = submit(server, alice, [USER_PY, "-c", COUNTING, str(log)], time_limit=4.0)
    row = server.wait_state(job, ("TIMEOUT",))
    assert row["signal"] == signal.SIGKILL  # it ignored SIGTERM: killed after the grace
    lines = _noted(log, 6)
    pids = {ln.split()[0] for ln in lines if " up" in ln}
    terms = sorted(ln.split()[0] for ln in lines if ln.endswith(f" {int(signal.SIGTERM)}"))
    assert len(pids) == 3 and terms == sorted(pids), lines


def test_signal_before_the_time_limit_as_slurm(server: Server) -> None:
    """`--signal=USR1@SECONDS` (Slurm's): USR1, once to every process, that long before
    the limit; with `B:`, to the job's first process only."""
    alice = make_user("alice", ("lab",))
    every, first = server.work / "every.log", server.work / "first.log"
    jobs = [
        submit(
            server,
            alice,
            [USER_PY, "-c", COUNTING, str(path)],
            time_limit=30.0,
            signal={"number": int(signal.SIGUSR1), "before": 29.0, "batch": batch},
        )
        for path, batch in ((every, False), (first, True))
    ]
    usr1, term = f" {int(signal.SIGUSR1)}", f" {int(signal.SIGTERM)}"
    _noted(every, 6)
    _noted(first, 4)
    assert server.job(jobs[0])["reason"] == "signalled"
    server.call(None, "cancel", jobs=jobs)  # one SIGTERM each: after any other signal
    for path, receivers in ((every, 3), (first, 1)):
        lines = _noted(path, 3 + receivers + 3)
        assert len([ln for ln in lines if ln.endswith(term)]) == 3, lines
        got = [ln.split()[0] for ln in lines if ln.endswith(usr1)]
        firsts = [ln.split()[0] for ln in lines if ln.endswith("up-first")]
        assert len(got) == receivers and (receivers == 3 or got == firsts), lines
    assert (
        "--signal needs --time"
        in server.call(alice, "submit", argv=["true"], cwd="/", signal={"number": 10, "before": 5})[
            "error"
        ]
    )
