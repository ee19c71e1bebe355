"""The queue service keeps its jobs across a kill -9 or a restart, and keeps answering
past clients that send junk or stall.

A running job outlives a killed service and is re-adopted with its real exit status; an
ended job's records go once its end is committed, and a restart removes those a kill
left behind; a malformed, oversized or half-sent request costs only its sender.
(Attached runs across restarts: test_service_attached.py; under a thousand kills:
test_service_stress.py.)
"""

from __future__ import annotations

import contextlib
import signal
import time
from pathlib import Path

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
