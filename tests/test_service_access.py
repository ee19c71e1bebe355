"""Who may do what with the queue service's jobs, and who sees what of them.

The real service of tests/servicetools.py, as root, with real Unix users as clients
(identity from SO_PEERCRED, never from what a request says): a job runs as its
submitter, only its owner or an admin may act on it, nobody else sees its command line
or start error (in the queue, `status`, `jobs` or the lease records), and a uid given to
a new account inherits nothing of the old one's.
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest

from gpuwarden.service import store as st
from gpuwarden.service.identity import Person
from servicetools import SPEC, USER_PY, Server, cli_with_gpus, serving, submit
from users import make_user

PROBE = (
    "import os, json; print(json.dumps({'uid': os.getuid(), 'gid': os.getgid(), "
    "'groups': sorted(os.getgroups()), 'cvd': os.environ.get('CUDA_VISIBLE_DEVICES'), "
    "'sim': os.environ.get('GPUWARDEN_SIM')}))"
)


def test_a_job_runs_as_its_submitter_whatever_it_claims(server: Server) -> None:
    alice = make_user("alice", groups=("lab",))
    hello = server.call(alice, "hello")
    assert hello["user"] == "gw-alice" and hello["uid"] == alice.uid and not hello["admin"]
    job = submit(server, alice, [USER_PY, "-c", PROBE], request={"count": 2})
    row = server.wait_state(job, ("COMPLETED", "FAILED"))
    assert row["state"] == "COMPLETED", row
    assert row["user"] == "gw-alice"  # $USER=bob in the request changed nothing
    out = json.loads((server.work / f"gpuwarden-{job}.out").read_text())
    assert out["uid"] == alice.uid and out["gid"] == alice.gid
    assert set(out["groups"]) == set(alice.groups) and len(out["groups"]) >= 2
    assert len(out["cvd"].split(",")) == 2 and len(row["gpus"]) == 2
    assert out["sim"] == SPEC  # the service's simulated machine is its jobs' too
    where = ",".join(str(i) for i in row["indices"])
    assert f"job {job} started on GPUs {where} for gw-alice" in server.log.read_text()


def test_only_the_owner_or_an_admin_may_act_on_a_job(server: Server) -> None:
    alice, bob, carol = make_user("alice", ("lab",)), make_user("bob"), make_user("carol")
    job = submit(server, alice, ["sleep", "60"], request={"count": 4})
    server.wait_state(job, ("RUNNING",))
    for op in ("cancel", "hold"):
        refused = server.call(bob, op, jobs=[job])
        assert "only its owner or an admin" in refused["error"], refused
    assert "only its owner or an admin" in server.call(bob, "logs", job=job)["error"]
    assert server.call(carol, "hello")["admin"] is True
    assert server.call(carol, "cancel", jobs=[job])["jobs"] == [job]
    row = server.wait_state(job, ("CANCELLED",))
    assert row["signal"] == signal.SIGTERM


def test_commands_of_others_are_hidden(server: Server) -> None:
    alice, bob = make_user("alice", ("lab",)), make_user("bob")
    job = submit(server, alice, ["sleep", "30"], hold=True)
    rows = {r["id"]: r for r in server.call(bob, "queue")["jobs"]}
    assert rows[job]["command"] is None and rows[job]["reason"] == "Held"
    assert server.call(alice, "queue")["jobs"][0]["command"] == ["sleep", "30"]
    server.call(alice, "cancel", jobs=[job])


def test_nobody_sees_others_command_lines_or_start_errors(server: Server) -> None:
    """Issue 23: `status` (text and JSON), `jobs` and the lease records others can read
    carry no one else's command line or start error; the owner and admins see them."""
    alice, bob = make_user("alice", ("lab",)), make_user("bob")
    running = submit(server, alice, ["sh", "-c", "sleep 60", "secret-token-1"])
    server.wait_state(running, ("RUNNING",))
    failed = submit(server, alice, ["/nonexistent/secret-token-2"])
    assert "secret-token-2" in server.wait_state(failed, ("FAILED",))["error"]
    leases = os.environ["GPUWARDEN_LEASE_DIR"]
    for name in os.listdir(leases):
        assert "secret-token" not in Path(leases, name).read_text(errors="replace"), name

    def as_user(who: Person, *args: str) -> str:
        done = cli_with_gpus(server, who, *args)
        assert done.returncode == 0, done.stderr
        return done.stdout

    for args in (("status",), ("status", "--json"), ("jobs",), ("jobs", "--json"), ("queue",)):
        shown = as_user(bob, *args)
        assert "secret-token" not in shown, (args, shown)
        assert "gw-alice" in shown, (args, shown)
    assert "secret-token-2" in as_user(alice, "jobs")
    assert "secret-token-1" in as_user(alice, "queue")
    server.call(None, "cancel", jobs=[running])


def test_a_reused_uid_does_not_inherit_the_old_users_jobs(
    tmp_path: Path, open_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 23: a journal's jobs are their owner's by uid and name: a uid given to a new
    account does not make the old user's jobs, commands and logs the new one's."""
    alice = make_user("alice", ("lab",))
    journal = st.Store(str(tmp_path / "service" / "jobs.db"))
    old = journal.add(
        st.new_job(
            uid=alice.uid,
            gid=alice.gid,
            user="gw-gone",
            argv=("secret-of-the-old-user",),
            cwd="/",
            env={},
            umask=0o022,
            request={"count": 1},
            state=st.COMPLETED,
            ended=time.time(),
            exit_code=0,
            output="/dev/null",
        )
    )
    journal.close()
    srv = next(serving(tmp_path, open_dir, monkeypatch))
    try:
        refused = srv.call(alice, "logs", job=old.id)
        assert refused["error"] == (
            f"job {old.id} belongs to gw-gone: only its owner or an admin may read the logs of it"
        )
        (row,) = [r for r in srv.call(alice, "jobs")["jobs"] if r["id"] == old.id]
        assert row["command"] is None
    finally:
        if srv.proc and srv.proc.poll() is None:
            srv.kill(signal.SIGTERM)
        srv.kill_jobs()
