"""A job that cannot start is a failed job like any other: its owner's `--notify fail`
hears of it, the service's log says why once and that it ended; and `cancel --me` over
an array and its tasks cancels them all and exits 0."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer
from typing import Any

import pytest

from servicetools import Server, cli_as, submit
from users import make_user
from waiting import wait_for


class Answering(BaseHTTPRequestHandler):
    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.server.got.append(body)  # type: ignore[attr-defined]
        self.send_response(204)
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def hook() -> Iterator[HTTPServer]:
    httpd = HTTPServer(("127.0.0.1", 0), Answering)
    httpd.got = []  # type: ignore[attr-defined]
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield httpd
    httpd.shutdown()
    httpd.server_close()


def test_a_job_that_cannot_start_is_notified_and_logged_once(
    server: Server, hook: HTTPServer
) -> None:
    alice = make_user("alice", ("lab",))
    url = f"http://127.0.0.1:{hook.server_address[1]}/hook"
    job = submit(server, alice, ["/nonexistent/command"], notify=["FAIL"], notify_url=url)
    row = server.wait_state(job, ("FAILED",))
    assert not row["error"].startswith(f"job {job} could not start"), row["error"]
    got = wait_for(lambda: hook.got, 30, "the FAIL post")  # type: ignore[attr-defined]
    assert got[0]["event"] == "FAIL" and got[0]["job"] == job and got[0]["state"] == "FAILED"
    assert got[0]["error"] == row["error"]
    server.wait_log(f"job {job} ended: FAILED (it never started)")
    log = server.log.read_text()
    assert log.count(f"job {job} could not start") == 1
    assert f"could not start: job {job} could not start" not in log


def test_cancel_me_over_an_array_cancels_every_task_and_exits_0(server: Server) -> None:
    alice = make_user("alice", ("lab",))
    array = submit(server, alice, ["sleep", "300"], array="0-3", request={"count": 4})
    server.wait_state(array, ("RUNNING",))
    done = cli_as(server, alice, "cancel", "--me")
    assert (done.returncode, done.stderr) == (0, ""), done.stderr
    assert done.stdout.startswith("cancelled: "), done.stdout
    assert "has ended" not in done.stdout + done.stderr
    rows = server.call(None, "jobs", limit=1000)["jobs"]
    tasks = [r for r in rows if r.get("array_job") == array]
    wait_for(
        lambda: all(server.job(r["id"])["state"] == "CANCELLED" for r in tasks) and len(tasks) == 4,
        30,
        "every task cancelled",
    )
