"""The queue service end to end, as root, with real Unix users as clients.

The service and its clients are tests/servicetools.py's: a real `gpuwarden serve` on a
simulated server of four idle A100s, real users (identity from SO_PEERCRED), jobs run
as their owners. Each test that needs users skips where they cannot be made, and fails
under CI, which runs as root.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Optional

import pytest

from gpuwarden.service import store as st
from gpuwarden.service.identity import Person
from repo import SRC
from servicetools import SPEC, USER_PY, Server, attached_again, become, cli_as, serving, submit
from users import make_user
from waiting import wait_for


@pytest.fixture
def limited(tmp_path: Path, open_dir: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Server]:
    """A service whose users may keep two jobs, use two GPUs at once and must declare
    --time of 90 s at most."""
    yield from serving(
        tmp_path,
        open_dir,
        monkeypatch,
        *("--max-jobs-per-user", "2", "--max-time", "90s", "--max-gpus-per-user", "2"),
    )


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


ATTACHED = """
import json, os, sys
from gpuwarden.errors import UserError
from gpuwarden.queueclient.client import run_attached
fields = json.loads(sys.argv[2])
fields["cwd"] = os.getcwd()
fields["env"] = dict(os.environ)
try:
    sys.exit(run_attached(fields, sys.argv[1], reconnect=float(sys.argv[3])))
except UserError as err:
    print("gpuwarden run: " + str(err), file=sys.stderr)
    sys.exit(2)
"""


def attached(
    srv: Server, who: Person, argv: list[str], reconnect: float = 60, **popen: Any
) -> subprocess.Popen[str]:
    env = {"PYTHONPATH": str(SRC), "PATH": "/usr/bin:/bin"}
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
    script = (
        "import os, signal, sys, time\n"
        "signal.signal(signal.SIGINT, lambda *a: sys.exit(42))\n"
        "print('ready', flush=True)\n"
        f"while not os.path.exists({str(flag)!r}): time.sleep(0.02)\n"
        "print('still here', flush=True)\n"
        "time.sleep(60)\n"
    )
    proc = attached(server, alice, [USER_PY, "-c", script])
    assert proc.stdout is not None and proc.stdout.readline() == "ready\n"
    (job,) = [r["id"] for r in server.call(None, "queue")["jobs"]]
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
    sendmail.write_text(f"#!/bin/sh\ncat >> {mailbox}\n")
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
        wait_for(lambda: got and mailbox.exists(), 30, "the webhook's event and the mail")
        assert got and got[0]["job"] == job and got[0]["state"] == "FAILED"
        assert got[0]["exit_code"] == 3 and got[0]["user"] == "gw-alice"
        mail = mailbox.read_text()
        assert "To: gw-alice" in mail and f"Subject: gpuwarden job {job} failed (exit 3)" in mail
    finally:
        srv.kill(signal.SIGTERM)
        web.shutdown()


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


def test_per_user_limits_refuse_in_one_line_and_spare_admins(limited: Server) -> None:
    """max_time: --time required and bounded (read as Slurm reads it: `--time 2` is two
    minutes); max_jobs_per_user: queued and running jobs counted; a request wider than
    max_gpus_per_user, which could only wait for ever, refused; admins exempt."""
    alice, carol = make_user("alice", ("lab",)), make_user("carol")
    untimed = cli_as(limited, alice, "submit", "--", "sleep", "30")
    assert untimed.returncode == 2, untimed.stderr
    assert untimed.stderr == (
        "gpuwarden submit: this machine needs --time on every job, at most 1m30s (max_time)\n"
    )
    long = cli_as(limited, alice, "submit", "--time", "2", "--", "sleep", "30")
    assert long.returncode == 2 and long.stderr == (
        "gpuwarden submit: --time 2m00s is over this machine's limit of 1m30s (max_time)\n"
    ), long.stderr
    wide = cli_as(limited, alice, "submit", "-g", "3", "--time", "1", "--", "true")
    assert wide.returncode == 2 and wide.stderr == (
        "gpuwarden submit: 3 GPUs is more than the 2 a user may use at once on this machine "
        "(max_gpus_per_user)\n"
    ), wide.stderr
    kept = [cli_as(limited, alice, "submit", "--time", "1", "--", "sleep", "30") for _ in "ab"]
    assert [k.returncode for k in kept] == [0, 0], [k.stderr for k in kept]
    third = cli_as(limited, alice, "submit", "--time", "90s", "--", "true")
    assert third.returncode == 2 and "you have 2 jobs queued or running" in third.stderr
    admin = [cli_as(limited, carol, "submit", "-g", "3", "--", "sleep", "30") for _ in "abc"]
    assert [a.returncode for a in admin] == [0, 0, 0], [a.stderr for a in admin]  # exempt
    kept += admin
    for k in kept:
        limited.call(None, "cancel", jobs=[int(k.stdout)])


def test_a_reload_puts_a_raised_limit_in_force_without_a_restart(
    tmp_path: Path, open_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 23: raising max_gpus_per_user and reloading accepts a job refused before;
    a broken file is refused in one line naming the key and the old policy stays;
    SIGHUP reloads too, and [service.limits] gives a group its own limit, which a
    refusal names."""
    conf = open_dir / "config.toml"
    conf.write_text("[service]\nmax_gpus_per_user = 1\n")
    monkeypatch.setenv("GPUWARDEN_SYSTEM_CONFIG", str(conf))
    srv = next(serving(tmp_path, open_dir, monkeypatch))
    try:
        alice = make_user("alice", ("lab",))
        wide = ("submit", "-g", "2", "--", "sleep", "60")
        refused = cli_as(srv, alice, *wide)
        assert refused.returncode == 2 and refused.stderr.endswith("(max_gpus_per_user)\n")
        conf.write_text("[service]\nmax_gpus_per_user = 2\n")
        reload = cli_as(srv, alice, "service", "reload")
        assert (reload.returncode, reload.stderr) == (
            2,
            "gpuwarden service: only an admin may reload the service's policy\n",
        )
        env = {"GPUWARDEN_SOCKET": srv.socket, "GPUWARDEN_SYSTEM_CONFIG": str(conf)}
        reload = subprocess.run(
            [sys.executable, "-m", "gpuwarden", "service", "reload"],
            env={**os.environ, "PYTHONPATH": str(SRC), **env},
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert reload.returncode == 0, reload.stderr
        assert reload.stdout == "max_gpus_per_user: 1 -> 2\nreloaded: 1 change(s)\n"
        accepted = cli_as(srv, alice, *wide)
        assert accepted.returncode == 0, accepted.stderr
        srv.wait_state(int(accepted.stdout), ("RUNNING",))
        assert "reload: max_gpus_per_user: 1 -> 2" in srv.log.read_text()

        conf.write_text('[service]\nmax_gpus_per_user = "lots"\n')
        broken = srv.call(None, "reload")
        assert "service.max_gpus_per_user must be" in broken["error"]
        assert broken["error"].endswith("; the policy in force stays")
        assert "\n" not in broken["error"]
        still = cli_as(srv, alice, "submit", "-g", "3", "--", "true")
        assert still.returncode == 2 and "more than the 2 a user" in still.stderr

        conf.write_text(
            '[service]\nmax_gpus_per_user = 2\n[service.limits]\n"@gw-lab" = { max_gpus = 3 }\n'
        )
        assert srv.proc is not None
        srv.proc.send_signal(signal.SIGHUP)
        srv.wait_log("reload: limits")
        four = cli_as(srv, alice, "submit", "-g", "4", "--", "true")
        assert four.returncode == 2, four.stderr
        assert four.stderr.endswith("(service.limits @gw-lab max_gpus)\n"), four.stderr
        shown = cli_as(srv, alice, "limits")
        assert shown.returncode == 0, shown.stderr
        assert "service.limits @gw-lab max_gpus" in shown.stdout
        as_json = json.loads(cli_as(srv, alice, "limits", "--json").stdout)
        jsonschema = pytest.importorskip("jsonschema")
        schema = Path(SRC, "gpuwarden", "schemas", "limits.json").read_text()
        jsonschema.validate(as_json, json.loads(schema))
        rows = {r["limit"]: (r["value"], r["used"], r["rule"]) for r in as_json["limits"]}
        assert rows["max_gpus"] == (3, 2, "service.limits @gw-lab max_gpus"), rows
        srv.call(None, "cancel", jobs=[int(accepted.stdout)])
    finally:
        if srv.proc and srv.proc.poll() is None:
            srv.kill(signal.SIGTERM)
        srv.kill_jobs()


def cli_with_gpus(
    srv: Server, who: Person, *args: str, socket: Optional[str] = None, **extra: str
) -> subprocess.CompletedProcess[str]:
    """`gpuwarden ARGS` as `who` on the simulated machine, with the service's lease
    directory (the simulator stands behind nvidia-ml-py's module: a copy they can read)."""
    from gpuwarden.sim.fake import real_pynvml_path

    lib = srv.work.parent / "lib"
    if not lib.exists():
        lib.mkdir(mode=0o755)
        shutil.copy(real_pynvml_path(), lib / "pynvml.py")
    env = {
        "PYTHONPATH": f"{SRC}:{lib}",
        "PATH": "/usr/bin:/bin",
        "GPUWARDEN_SOCKET": socket or srv.socket,
        "GPUWARDEN_SIM": SPEC,
        "GPUWARDEN_LEASE_DIR": os.environ["GPUWARDEN_LEASE_DIR"],
        **extra,
    }
    return subprocess.run(
        [USER_PY, "-m", "gpuwarden", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        preexec_fn=become(who),
        cwd=str(srv.work),
    )


def test_commands_under_a_stopped_service_say_to_ask_an_admin(server: Server) -> None:
    """Issue 23: with the service stopped its lease directory is root's; `run` and
    `reserve` said `Permission denied` on alloc.lock. Now one line: ask an admin."""
    alice = make_user("alice", ("lab",))
    gone = str(server.work.parent / "stopped.sock")
    for args in (("run", "--", "true"), ("reserve", "-g", "1")):
        done = cli_with_gpus(server, alice, *args, socket=gone)
        assert done.returncode != 0
        lines = done.stderr.splitlines()
        assert len(lines) == 1 and "which is not running: ask an admin to start it" in lines[0]
    state = server.work.parent / "state"  # as service install leaves it: root's, 0755
    state.mkdir(mode=0o755)
    drain = cli_with_gpus(
        server, alice, "drain", "0", "--reason", "x", GPUWARDEN_STATE_DIR=str(state)
    )
    assert drain.returncode == 2 and drain.stderr == (
        "gpuwarden drain: only an admin may drain or undrain GPUs on this machine (its state "
        f"directory {state} is root's): ask one, e.g. `sudo gpuwarden drain ...`\n"
    )


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


def test_reserve_and_select_point_to_what_the_service_accepts(limited: Server) -> None:
    """Issue 23: `reserve`'s hint left out the --time this machine requires, and `select`
    recommended `reserve`, which the service refuses."""
    alice = make_user("alice", ("lab",))
    refused = cli_as(limited, alice, "reserve", "-g", "1")
    assert refused.returncode == 2, refused.stderr
    assert "`gpuwarden run -g 1 --time 1m30s -- $SHELL`" in refused.stderr
    chosen = cli_with_gpus(limited, alice, "select", "-g", "1")
    assert chosen.returncode == 0, chosen.stderr
    assert "`gpuwarden reserve`" not in chosen.stderr
    assert "through the queue service" in chosen.stderr


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


def test_service_leases_name_the_owner_and_cannot_be_held_by_users(server: Server) -> None:
    """The service leases as root, for the job's owner: status names the owner, and no
    user can open (and so hold) a GPU's lock file in the service's directory."""
    alice, bob = make_user("alice", ("lab",)), make_user("bob")
    job = submit(server, alice, ["sleep", "60"], request={"count": 1})
    row = server.wait_state(job, ("RUNNING",))
    lease_dir = Path(os.environ["GPUWARDEN_LEASE_DIR"])
    lock = lease_dir / f"{row['gpus'][0]}.lock"
    assert lock.stat().st_mode & 0o777 == 0o600
    probe = subprocess.run(
        [USER_PY, "-c", f"open({str(lock)!r})"],
        preexec_fn=become(bob),
        capture_output=True,
        text=True,
    )
    assert probe.returncode != 0 and "Permission denied" in probe.stderr
    from gpuwarden import leases

    [mine] = [lease for lease in leases.list_leases(str(lease_dir)) if lease.job == str(job)]
    assert mine.user == "gw-alice"
    assert mine.expires is None  # no --time: the lease lasts as long as the job
    limited = submit(server, alice, ["sleep", "60"], request={"count": 1}, time_limit=600)
    server.wait_state(limited, ("RUNNING",))
    [timed] = [x for x in leases.list_leases(str(lease_dir)) if x.job == str(limited)]
    assert timed.expires is not None and 590 < timed.expires - timed.started <= 601
    shown = subprocess.run(
        [sys.executable, "-m", "gpuwarden", "status"],
        env=dict(os.environ, PYTHONPATH=str(SRC), GPUWARDEN_SIM=SPEC),
        capture_output=True,
        text=True,
        timeout=60,
    )
    leased = [x.split() for x in shown.stdout.splitlines() if x.startswith("GPU ")]
    [row] = [x for x in leased if x[3:4] == [str(limited)]]  # GPU n user job pid age ...
    assert row[2] == "gw-alice", shown.stdout
    expires_in = row[7]  # 10m00s, or a little less if the status came a moment later
    assert row[6] == "in" and (expires_in == "10m00s" or expires_in.startswith("9m")), shown.stdout
    server.call(None, "cancel", jobs=[job, limited])
    server.wait_state(job, ("CANCELLED",))
    server.wait_state(limited, ("CANCELLED",))
    assert not list(lease_dir.glob(f"*.{job}.lease"))


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
