"""`gpuwarden run` through the queue service: an attached job, which its client stands for.

The client (queueclient's `run_attached`, as a real user) passes its terminal to the
job, gets the job's output and exit status, forwards Ctrl-C, and attaches again after
each restart of the service. A job whose client dies is ended, as a job whose shell
died; a client whose service does not come back within service.reconnect says so.
"""

from __future__ import annotations

import json
import signal
import subprocess
from pathlib import Path
from typing import Any

from gpuwarden.service.identity import Person
from hermetic import hermetic
from repo import SRC
from servicetools import USER_PY, Server, attached_again, become, submit
from users import make_user
from waiting import wait_for

ATTACHED = """
import json, os, sys
from gpuwarden.base.errors import UserError
from gpuwarden.queueclient.client import run_attached
fields = json.loads(sys.argv[2])
fields["cwd"] = os.getcwd()
fields["env"] = dict(os.environ)
try:
    sys.exit(run_attached(fields, sys.argv[1], None, reconnect=float(sys.argv[3])))
except UserError as err:
    print("gpuwarden run: " + str(err), file=sys.stderr)
    sys.exit(2)
"""


def attached(
    srv: Server, who: Person, argv: list[str], reconnect: float = 60, **popen: Any
) -> subprocess.Popen[str]:
    env = {**hermetic(), "PYTHONPATH": str(SRC), "PATH": "/usr/bin:/bin"}
    fields = json.dumps({"argv": argv, "request": {"count": 1}})
    return subprocess.Popen(
        [USER_PY, "-c", ATTACHED, srv.socket, fields, str(reconnect)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=become(who),
        cwd=str(srv.work),
        **popen,
    )


def ready_until(
    srv: Server, who: Person, flag: Path, then: str, setup: str = ""
) -> tuple[subprocess.Popen[str], int]:
    """An attached job of `who` that runs `setup`, says `ready`, waits until `flag`
    exists, then runs `then`; returned once it said `ready`, with its job id."""
    script = (
        "import os, signal, sys, time\n"
        f"{setup}"
        "print('ready', flush=True)\n"
        f"while not os.path.exists({str(flag)!r}): time.sleep(0.02)\n"
        f"{then}"
    )
    proc = attached(srv, who, [USER_PY, "-c", script])
    assert proc.stdout is not None and proc.stdout.readline() == "ready\n"
    (job,) = [r["id"] for r in srv.call(None, "queue")["jobs"]]
    return proc, job


def test_attached_run_output_and_exit_status_are_the_jobs(server: Server) -> None:
    alice = make_user("alice", ("lab",))
    script = "import os, sys; print('out', os.getuid()); print('err', file=sys.stderr); sys.exit(5)"
    proc = attached(server, alice, [USER_PY, "-c", script])
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 5, err
    assert out == f"out {alice.uid}\n" and err == "err\n"


def test_ctrl_c_reaches_the_attached_job(server: Server) -> None:
    alice = make_user("alice", ("lab",))
    script = (
        "import signal, sys, time\n"
        "signal.signal(signal.SIGINT, lambda *a: sys.exit(42))\n"
        "print('ready', flush=True)\n"
        "time.sleep(60)\n"
    )
    proc = attached(server, alice, [USER_PY, "-c", script])
    assert proc.stdout is not None
    assert proc.stdout.readline() == "ready\n"
    proc.send_signal(signal.SIGINT)
    assert proc.wait(30) == 42


def test_an_attached_job_ends_when_its_client_is_killed(server: Server) -> None:
    alice = make_user("alice", ("lab",))
    proc = attached(server, alice, ["sh", "-c", "echo ready; exec sleep 60"])
    assert proc.stdout is not None and proc.stdout.readline() == "ready\n"
    job = max(r["id"] for r in server.call(None, "queue")["jobs"])
    proc.kill()
    proc.wait(10)
    assert server.wait_state(job, ("CANCELLED",))["signal"] == signal.SIGTERM


def test_an_attached_run_outlives_sigterm_and_sigkill_restarts(server: Server) -> None:
    """Issue 23: a restart of the service ends no attached job. The job keeps its
    terminal, the client attaches again after each restart, Ctrl-C reaches the job
    after both, and the client exits with the job's own status."""
    alice = make_user("alice", ("lab",))
    flag = server.work / "go"
    proc, job = ready_until(
        server,
        alice,
        flag,
        "print('still here', flush=True)\ntime.sleep(60)\n",
        setup="signal.signal(signal.SIGINT, lambda *a: sys.exit(42))\n",
    )
    assert proc.stdout is not None
    server.kill(signal.SIGTERM)
    server.start()
    attached_again(server, 1)
    server.kill(signal.SIGKILL)
    server.start()
    attached_again(server, 2)
    assert server.job(job)["state"] == "RUNNING"
    flag.touch()
    assert proc.stdout.readline() == "still here\n"  # its terminal is still the client's
    proc.send_signal(signal.SIGINT)
    assert proc.wait(30) == 42, proc.stderr.read() if proc.stderr else ""
    assert server.wait_state(job, ("FAILED",))["exit_code"] == 42


def test_a_client_back_after_its_job_ended_gets_its_status_and_its_terminal_back(
    server: Server,
) -> None:
    """A job that ended while the service was down: its client, back, is told the job's
    status, and the service keeps no copy of the terminal the client passed again (its
    pipes close, as after any job; a kept copy left the client's reader waiting)."""
    alice = make_user("alice", ("lab",))
    flag = server.work / "go"
    proc, job = ready_until(server, alice, flag, "sys.exit(7)\n")
    server.kill(signal.SIGKILL)
    flag.touch()
    record = Path(server.state) / "jobs" / f"{job}.exit"
    wait_for(record.exists, 30, "the job's exit record, written while no service ran")
    server.start()
    out, err = proc.communicate(timeout=30)
    assert (proc.returncode, out) == (7, ""), err
    assert server.job(job)["state"] == "FAILED"


def test_a_waiting_attached_run_starts_after_a_restart_and_ctrl_c_gives_130(
    server: Server,
) -> None:
    """A job still waiting when the service restarts starts once its client is back (it
    passes its terminal again); Ctrl-C while one waits ends it with 130, as in a shell."""
    alice = make_user("alice", ("lab",))
    blocker = submit(server, alice, ["sleep", "60"], request={"count": 4})
    server.wait_state(blocker, ("RUNNING",))
    proc = attached(server, alice, ["sh", "-c", "echo started; exit 3"])
    waiting = attached(server, alice, ["true"])
    wait_for(
        lambda: len(server.call(None, "queue")["jobs"]) >= 3, 30, "the three jobs in the queue"
    )
    server.kill(signal.SIGKILL)
    server.start()
    attached_again(server, 2)
    waiting.send_signal(signal.SIGINT)
    assert waiting.wait(30) == 130
    server.call(None, "cancel", jobs=[blocker])
    out, err = proc.communicate(timeout=30)
    assert (proc.returncode, out) == (3, "started\n"), err


def test_a_client_whose_service_never_returns_says_so_and_its_job_ends_later(
    server: Server,
) -> None:
    alice = make_user("alice", ("lab",))
    proc = attached(server, alice, ["sh", "-c", "echo ready; exec sleep 60"], reconnect=0.5)
    assert proc.stdout is not None and proc.stdout.readline() == "ready\n"
    (job,) = [r["id"] for r in server.call(None, "queue")["jobs"]]
    server.kill(signal.SIGKILL)
    assert proc.wait(30) == 2
    server.start()  # finds the client gone: the job ends as if its shell had died
    assert server.wait_state(job, ("CANCELLED",))["signal"] == signal.SIGTERM
    _, err = proc.communicate(timeout=30)  # the job held the pipes until now
    assert err.strip().splitlines() == [
        f"gpuwarden run: lost the service at {server.socket} and it did not come back "
        f"within 0.5s (service.reconnect); job {job} is ended when it does"
    ]
