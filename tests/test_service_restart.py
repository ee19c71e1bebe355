"""The queue service keeps its jobs across a kill -9 or a restart, and keeps answering
past clients that send junk or stall.

A running job outlives a killed service and is re-adopted with its real exit status; an
ended job's records go once its end is committed, and a restart removes those a kill
left behind; a job whose marker a crash of the machine lost is never run again; a
malformed, oversized or half-sent request costs only its sender.
(Attached runs across restarts: test_service_attached.py; under a thousand kills:
test_service_stress.py.)
"""

from __future__ import annotations

import contextlib
import os
import signal
import sqlite3
import time
from pathlib import Path

import pytest

from gpuwarden.service import boots, spawn, store
from servicetools import Server, submit
from users import make_user
from waiting import wait_for


def test_running_jobs_survive_a_service_kill_and_are_readopted(server: Server) -> None:
    alice = make_user("alice", ("lab",))
    job = submit(server, alice, ["sh", "-c", "sleep 1.5; exit 7"])
    waiting = submit(server, alice, ["true"], request={"count": 4})
    server.wait_state(job, ("RUNNING",))
    server.kill(signal.SIGKILL)
    server.start()
    row = server.wait_state(job, ("FAILED", "COMPLETED", "LOST"))
    assert row["state"] == "FAILED" and row["exit_code"] == 7  # its real status, not lost
    assert server.wait_state(waiting, ("COMPLETED",))["state"] == "COMPLETED"


def test_a_supervisor_that_took_a_second_job_is_readopted_for_it_alone(server: Server) -> None:
    """A supervisor whose job ended takes the next (service.forker): its marker's pid and
    start time are those of the earlier job's. Killed while the second runs, the service
    restarts with the first ended as recorded and the second re-adopted, its real status
    read from the same supervisor's record when it ends."""
    alice = make_user("alice", ("lab",))
    first = submit(server, alice, ["true"])
    assert server.wait_state(first, ("COMPLETED",))["exit_code"] == 0
    second = submit(server, alice, ["sh", "-c", "sleep 1.5; exit 5"])
    server.wait_state(second, ("RUNNING",))
    exits = str(Path(server.state) / "jobs")
    marker = wait_for(lambda: spawn.read_marker(exits, str(second)), 10, "its marker")
    journal = store.Store(os.path.join(server.state, "jobs.db"))
    try:
        supervisors = [journal.get(j).supervisor for j in (first, second)]  # type: ignore[union-attr]
    finally:
        journal.close()
    assert supervisors[0] == supervisors[1] == marker["supervisor"], (supervisors, marker)
    server.kill(signal.SIGKILL)
    server.start()
    row = server.wait_state(second, ("FAILED", "COMPLETED", "LOST"))
    assert row["state"] == "FAILED" and row["exit_code"] == 5, (row, marker)
    assert server.job(first)["state"] == "COMPLETED"
    gone = lambda: not spawn.alive(marker["supervisor"], marker["since"])  # noqa: E731
    wait_for(gone, 30, "its supervisor to end after its job (its service has gone)")


def test_an_ended_jobs_records_go_once_its_end_is_committed_and_after_a_kill(
    server: Server,
) -> None:
    alice = make_user("alice", groups=("lab",))
    first = submit(server, alice, ["true"])
    assert server.wait_state(first, ("COMPLETED",))["exit_code"] == 0
    exits = Path(server.state) / "jobs"
    mine = lambda job_id: sorted(p.name for p in exits.glob(f"{job_id}.*"))  # noqa: E731
    wait_for(lambda: mine(first) == [], 10, lambda: f"job {first}'s records gone: {mine(first)}")
    assert mine(first) == []
    # A service killed between a job's end and the removal leaves them: a restart removes
    # them, and the records of a job still running stay.
    second = submit(server, alice, ["sleep", "30"])
    server.wait_state(second, ("RUNNING",))
    server.kill()
    for suffix in (".exit", ".started"):
        (exits / f"{first}{suffix}").write_text("{}")
    server.start()
    assert server.job(second)["state"] == "RUNNING"  # answered: recovery is over
    assert mine(first) == [] and f"{second}.started" in mine(second)


@pytest.mark.parametrize("boot", ["this", "earlier"])
def test_a_job_without_its_marker_is_queued_again_only_if_it_started_in_this_boot(
    server: Server, boot: str
) -> None:
    """A job's marker is named before it execs but not waited onto the disk: a crash of
    the service keeps it, a crash of the machine may lose it, and ends the job. Here
    the machine's crash as a restart sees it: the service and every process of a
    running job killed, its marker and room gone. Started in this boot (the journal's
    boot is this one), no marker means never run: queued again. Started in an earlier
    boot, the job may have run: LOST, never run again."""
    alice = make_user("alice", ("lab",))
    ran = server.work / f"ran-{boot}"
    job = submit(server, alice, ["sh", "-c", f"echo ran >> {ran}; exec sleep 60"])
    server.wait_state(job, ("RUNNING",))
    wait_for(ran.exists, 30, "the job to run")
    exits = Path(server.state) / "jobs"
    marker = wait_for(
        lambda: (
            (spawn.read_marker(str(exits), str(job)) or {}).get("pid")
            and spawn.read_marker(str(exits), str(job))
        ),
        30,
        "the job's pid in its marker",
    )
    supervisor = marker["supervisor"]
    server.kill()
    os.kill(supervisor, signal.SIGKILL)  # first: it writes no exit record
    wait_for(lambda: spawn.start_time(supervisor) < 0, 30, "the supervisor to be gone")
    os.killpg(marker["pid"], signal.SIGKILL)  # as the machine's crash ends them all
    server.forget_cgroups()
    for suffix in (".started", ".ending"):
        (exits / f"{job}{suffix}").unlink()
    with contextlib.closing(sqlite3.connect(Path(server.state) / "jobs.db")) as db, db:
        (recorded,) = db.execute("SELECT value FROM meta WHERE key = 'boot'").fetchone()
        assert recorded == boots.current()  # the service recorded its boot at its start
        if boot == "earlier":
            db.execute("UPDATE meta SET value = 'an-earlier-boot' WHERE key = 'boot'")
    server.start()
    if boot == "earlier":
        row = server.wait_state(job, ("LOST",))
        assert "went down" in (row["error"] or ""), row  # ended: never queued again
    else:
        server.wait_log(f"job {job} never started before a restart; queued again")
        wait_for(lambda: ran.read_text() == "ran\nran\n", 30, "the job to run again")
    with contextlib.closing(sqlite3.connect(Path(server.state) / "jobs.db")) as db:
        assert db.execute("SELECT value FROM meta WHERE key = 'boot'").fetchone() == (
            boots.current(),
        )  # this boot's, once recovery is over


def test_a_restart_removes_what_a_killed_spare_made_for_its_job(server: Server) -> None:
    """A spare supervisor makes its job's room and marker data before its launch
    (service.staging) and removes them if it gets none; one killed meanwhile leaves
    them, and the next start of the service removes them."""
    exits = Path(server.state) / "jobs"

    def staged() -> list[str]:
        return sorted(p.name for p in exits.glob(".supervisor-*"))

    wait_for(lambda: len(staged()) >= 2, 30, "the spares' staged files")
    spare = int(staged()[0].split("-")[1])
    os.kill(spare, signal.SIGKILL)
    server.kill()
    wait_for(lambda: spawn.start_time(spare) < 0, 30, "the killed spare to be gone")
    assert [n for n in staged() if f"-{spare}-" in n]  # left by it
    server.start()
    assert not [n for n in staged() if f"-{spare}-" in n]


def test_malformed_requests_leave_the_serviceserving(server: Server) -> None:
    import socket

    for payload in (b"junk\n", b'{"v":1,"op":"nope"}\n', b'{"v":9}\n', b"x" * (2 << 20)):
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.connect(server.socket)
        with contextlib.suppress(OSError):
            sock.sendall(payload)
        sock.settimeout(10)
        with contextlib.suppress(OSError):
            answer = sock.recv(65536)
            assert b'"ok":false' in answer
        sock.close()
    assert server.call(None, "hello")["admin"] is True
    assert "argv" in server.call(None, "submit", argv=[], cwd="/")["error"]


def test_slow_and_silent_clients_delay_nobody(server: Server) -> None:
    import socket

    stalled = []
    for i in range(50):
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.connect(server.socket)
        if i % 2:
            sock.sendall(b'{"v":1,"op":"que')  # half a message, never finished
        stalled.append(sock)
    started = time.monotonic()
    assert server.call(None, "hello")["ok"] is True
    assert time.monotonic() - started < 5  # a subprocess client: start-up dominates
    for sock in stalled:
        sock.close()
