"""The queue from the command line, as its users type it: `run`, `submit`, `queue`,
`logs`, `cancel`, `hold`/`unhold`, `jobs` and `share`.

The real service of tests/servicetools.py, with real users through `cli_as`. Also which
waiting job starts first (fair share), the notice an owner gets when a job ends (webhook
and mail), and the queue as the exporter reports it.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Optional

import pytest

from gpuwarden.service import store as st
from repo import SRC
from servicetools import SPEC, Server, cli_as, submit
from users import make_user
from waiting import wait_for


def test_fair_share_starts_the_lighter_user_first(
    tmp_path: Path, open_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    alice, bob = make_user("alice", ("lab",)), make_user("bob")
    monkeypatch.setenv("GPUWARDEN_LEASE_DIR", str(tmp_path / "service-leases"))
    srv = Server(tmp_path, open_dir / "work", ())
    journal = st.Store(os.path.join(srv.state, "jobs.db"))
    now = time.time()
    journal.charge("gw-alice", 100 * 3600.0, now, 7 * 86400.0)
    journal.charge("gw-bob", 10 * 3600.0, now, 7 * 86400.0)
    journal.close()
    srv.start()
    try:
        blocker = submit(srv, alice, ["sleep", "60"], request={"count": 4})
        srv.wait_state(blocker, ("RUNNING",))
        first = submit(srv, alice, ["sleep", "60"], request={"count": 4})
        second = submit(srv, bob, ["sleep", "60"], request={"count": 4})
        srv.call(alice, "cancel", jobs=[blocker])
        srv.wait_state(second, ("RUNNING",))
        assert srv.job(first)["state"] == "PENDING"
        assert srv.job(first)["reason"] == "Resources"
    finally:
        srv.call(
            None, "cancel", jobs=[j for j in (first, second) if srv.job(j)["state"] in st.ACTIVE]
        )
        srv.kill(signal.SIGTERM)


def test_run_submit_queue_logs_cancel_through_the_service(server: Server) -> None:
    alice, bob = make_user("alice", ("lab",)), make_user("bob")
    ran = cli_as(
        server, alice, "run", "-g", "2", "--", "sh", "-c", 'echo "$CUDA_VISIBLE_DEVICES"; exit 4'
    )
    assert ran.returncode == 4, ran.stderr
    assert len(ran.stdout.strip().split(",")) == 2
    sub = cli_as(
        server, alice, "submit", "-g", "1", "--time", "1h", "--", "sh", "-c", "echo hello; sleep 60"
    )
    assert sub.returncode == 0, sub.stderr
    job = int(sub.stdout.strip())
    server.wait_state(job, ("RUNNING",))
    queue = cli_as(server, bob, "queue")
    assert queue.returncode == 0 and f"{job}" in queue.stdout and "gw-alice" in queue.stdout
    assert "(hidden)" in queue.stdout  # bob does not see alice's command
    hers = cli_as(server, bob, "queue", "--user", "gw-alice", "--json")
    assert [j["id"] for j in json.loads(hers.stdout)] == [job], hers.stderr
    assert json.loads(cli_as(server, bob, "queue", "--user", "gw-bob", "--json").stdout) == []

    def said_hello() -> Optional[subprocess.CompletedProcess[str]]:
        logs = cli_as(server, alice, "logs", str(job))
        return logs if "hello" in logs.stdout else None

    logs = wait_for(
        said_hello,
        30,
        lambda: f"the job's output through `logs`: {cli_as(server, alice, 'logs', str(job))}",
    )
    assert logs.stdout == "hello\n", logs.stderr
    denied = cli_as(server, bob, "logs", str(job))
    assert denied.returncode == 2 and "only its owner or an admin" in denied.stderr
    full = cli_as(server, alice, "run", "-g", "4", "--", "true")
    assert full.returncode == 75 and "add --wait" in full.stderr  # 1 of 4 is taken: not now
    done = cli_as(server, alice, "cancel", str(job))
    assert done.returncode == 0 and f"cancelled: {job}" in done.stdout
    assert server.wait_state(job, ("CANCELLED",))["signal"] == signal.SIGTERM


def test_run_waits_says_why_and_gives_up_after_its_timeout(server: Server) -> None:
    alice = make_user("alice", ("lab",))
    blocker = submit(server, alice, ["sleep", "60"], request={"count": 4})
    server.wait_state(blocker, ("RUNNING",))
    started = time.monotonic()
    waited = cli_as(server, alice, "run", "-g", "1", "--wait", "--timeout", "3s", "--", "true")
    took = time.monotonic() - started
    assert waited.returncode == 75, waited.stderr
    assert "waits: Resources" in waited.stderr and "gave up" in waited.stderr
    assert 2.5 < took < 20
    server.call(None, "cancel", jobs=[blocker])


def test_hold_unhold_jobs_and_share_from_the_command_line(server: Server) -> None:
    alice, bob = make_user("alice", ("lab",)), make_user("bob")
    job = submit(server, alice, ["true"], hold=True)
    assert server.job(job)["reason"] == "Held"
    refused = cli_as(server, bob, "unhold", str(job))
    assert refused.returncode == 2 and "only its owner or an admin" in refused.stderr
    done = cli_as(server, alice, "unhold", str(job))
    assert done.returncode == 0 and f"released: {job}" in done.stdout, done.stderr
    server.wait_state(job, ("COMPLETED",))
    history = cli_as(server, alice, "jobs", "--me")
    assert history.returncode == 0 and "COMPLETED" in history.stdout and "exit 0" in history.stdout
    share = cli_as(server, bob, "share")
    assert share.returncode == 0 and "gw-alice" in share.stdout, share.stderr
    bad = cli_as(server, alice, "hold", "nope")
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "invalid job id" in bad.stderr


def test_cancel_by_owner_state_and_range_as_scancel(server: Server) -> None:
    """Issue 23: after a flood nobody pastes 40 ids: `cancel --me`, `-u USER`,
    `--state PENDING|RUNNING` and ranges (12-20), each within what the asker may do."""
    alice, bob = make_user("alice", ("lab",)), make_user("bob")
    running = submit(server, alice, ["sleep", "60"])
    server.wait_state(running, ("RUNNING",))
    waiting = [submit(server, alice, ["true"], hold=True) for _ in range(3)]
    theirs = submit(server, bob, ["true"], hold=True)
    done = cli_as(server, alice, "cancel", "--me", "--state", "pending")
    assert done.returncode == 0, done.stderr
    assert done.stdout == f"cancelled: {', '.join(map(str, waiting))}\n"
    assert server.job(running)["state"] == "RUNNING" and server.job(theirs)["state"] == "PENDING"
    nothing = cli_as(server, alice, "cancel", "--me", "--state", "PENDING")
    assert (nothing.returncode, nothing.stderr) == (
        0,
        "gpuwarden cancel: no job queued or running matches\n",
    )
    others = cli_as(server, alice, "cancel", f"{running}-{theirs}")
    assert others.returncode == 1 and others.stdout == f"cancelled: {running}\n"
    assert f"job {theirs} belongs to gw-bob" in others.stderr
    assert server.wait_state(running, ("CANCELLED",))["state"] == "CANCELLED"
    assert cli_as(server, alice, "cancel").stderr == (
        "gpuwarden cancel: name the jobs to cancel: IDs (12 13, 12-20), --me, -u USER or --state\n"
    )
    assert cli_as(server, alice, "cancel", "20-12").stderr.startswith(
        "gpuwarden cancel: invalid job range '20-12'"
    )
    env = {**os.environ, "PYTHONPATH": str(SRC), "GPUWARDEN_SOCKET": server.socket}
    admin = subprocess.run(
        [sys.executable, "-m", "gpuwarden", "cancel", "-u", "gw-bob"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert (admin.returncode, admin.stdout) == (0, f"cancelled: {theirs}\n"), admin.stderr


def test_an_unwritable_output_is_refused_at_submit_and_logs_say_why_a_job_never_ran(
    server: Server,
) -> None:
    """Issue 23: `submit` checks, as the submitter, that the job's output can be written;
    `logs` of a job that never started says why and exits 1, not an empty 0."""
    alice = make_user("alice", ("lab",))
    closed = server.work.parent / "closed"  # root's, 0755: alice may not write there
    closed.mkdir(mode=0o755)
    refused = cli_as(server, alice, "submit", "--output", str(closed / "out.log"), "--", "true")
    assert (refused.returncode, refused.stderr) == (
        2,
        f"gpuwarden submit: you cannot write {closed}: the job's output would be lost; "
        "choose --output in a directory of yours\n",
    )
    assert not server.call(None, "queue")["jobs"]  # nothing was queued
    failed = submit(server, alice, ["/nonexistent/command"], output=str(server.work / "f.log"))
    error = server.wait_state(failed, ("FAILED",))["error"]
    logs = cli_as(server, alice, "logs", str(failed))
    assert logs.returncode == 1
    assert logs.stderr == f"gpuwarden logs: job {failed} did not start: {error}\n"


def test_queue_start_gives_every_waiting_job_a_start_as_squeue(server: Server) -> None:
    """Issue 23: an estimated start for every waiting job, not only the first."""
    alice = make_user("alice", ("lab",))
    blocker = submit(server, alice, ["sleep", "60"], request={"count": 4}, time_limit=120.0)
    server.wait_state(blocker, ("RUNNING",))
    waiting = [
        submit(server, alice, ["true"], request={"count": n}, time_limit=60.0) for n in (4, 2, 2)
    ]

    def estimated() -> list[dict[str, Any]]:
        rows = json.loads(cli_as(server, alice, "queue", "--start", "--json").stdout)
        return rows if all(r.get("estimated_start") for r in rows) and len(rows) == 3 else []

    rows = wait_for(estimated, 30, "an estimated start for each of the three waiting jobs")
    at = {r["id"]: r["estimated_start"] for r in rows}
    assert at[waiting[0]] < at[waiting[1]] == at[waiting[2]], at  # after the whole-box job
    table = cli_as(server, alice, "queue", "--start").stdout.splitlines()
    assert table[0].split() == ["JOBID", "USER", "START_TIME", "REASON"]
    assert len(table) == 4 and "N/A" not in "".join(table), table
    server.call(None, "cancel", jobs=[blocker, *waiting])


def test_owners_are_told_when_their_job_ends(
    tmp_path: Path, open_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A webhook gets the JSON event; `sendmail -t` gets a mail addressed to the owner."""
    import http.server
    import threading

    got: list[dict[str, Any]] = []

    class Hook(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            got.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
            self.send_response(204)
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    web = http.server.HTTPServer(("127.0.0.1", 0), Hook)
    threading.Thread(target=web.serve_forever, daemon=True).start()
    mailbox = tmp_path / "mail"
    sendmail = tmp_path / "sendmail"
    # the mail appears whole or not at all: the test reads it as soon as it exists
    sendmail.write_text(f"#!/bin/sh\ncat > {mailbox}.part && mv {mailbox}.part {mailbox}\n")
    sendmail.chmod(0o755)
    monkeypatch.setenv("GPUWARDEN_LEASE_DIR", str(tmp_path / "service-leases"))
    monkeypatch.setenv("GPUWARDEN_SERVICE_WEBHOOK", f"http://127.0.0.1:{web.server_port}/hook")
    monkeypatch.setenv("GPUWARDEN_SERVICE_SENDMAIL", str(sendmail))
    alice = make_user("alice", ("lab",))
    srv = Server(tmp_path, open_dir / "work", ())
    srv.start()
    try:
        job = submit(srv, alice, ["sh", "-c", "exit 3"])
        srv.wait_state(job, ("FAILED",))
        wait_for(
            lambda: got and mailbox.exists(),
            30,
            "the webhook's event and the mail",
        )
        assert got and got[0]["job"] == job and got[0]["state"] == "FAILED"
        assert got[0]["exit_code"] == 3 and got[0]["user"] == "gw-alice"
        mail = mailbox.read_text()
        assert "To: gw-alice" in mail and f"Subject: gpuwarden job {job} failed (exit 3)" in mail
    finally:
        srv.kill(signal.SIGTERM)
        web.shutdown()


def test_the_exporter_reports_the_queue(server: Server, cli: Any) -> None:
    alice = make_user("alice", ("lab",))
    running = submit(server, alice, ["sleep", "60"], request={"count": 4})
    submit(server, alice, ["true"], request={"count": 1})
    server.wait_state(running, ("RUNNING",))
    env = {"GPUWARDEN_SOCKET": server.socket, "GPUWARDEN_SIM": SPEC}
    out = cli("exporter", "--once", env=env)
    assert out.returncode == 0, out.stderr
    text = out.stdout
    assert "gpuwarden_queue_service_up{" in text and "service_up{hostname=" in text
    assert 'state="running",user="gw-alice"' in text and 'state="pending",user="gw-alice"' in text
    assert "gpuwarden_queue_wait_seconds_bucket{hostname=" in text and 'le="+Inf"' in text
    assert "gpuwarden_user_fairshare_factor{" in text
    server.call(None, "cancel", jobs=[running])
    no_service = cli("exporter", "--once", env={"GPUWARDEN_SOCKET": "/nonexistent/sock"})
    assert "gpuwarden_queue_service_up{" in no_service.stdout
    assert "} 0.0" in no_service.stdout.split("gpuwarden_queue_service_up{", 1)[1].split("\n")[0]
