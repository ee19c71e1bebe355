"""The queue service against an ordinary local user who means harm, with real Unix accounts.

Each attack is made as an unprivileged user on the root service of tests/servicetools.py
(tests/users.py); each test then checks that the attack was refused in one line
naming the bound, or harmless, and that the service still answers another user.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Optional

import pytest

from gpuwarden.queueclient import protocol
from gpuwarden.queueclient.probe import wait_until_running
from gpuwarden.service import spawn
from gpuwarden.service import store as st
from gpuwarden.service.identity import Person
from hermetic import hermetic
from repo import SRC
from servicetools import SPEC, USER_PY, Server, become, cli_as, serving, submit
from users import make_user


def as_user(who: Person, code: str, *args: str, timeout: float = 60) -> Any:
    """Run Python `code` as `who` with the service's socket as argv[1]; its JSON output."""
    run = subprocess.run(
        [USER_PY, "-c", code, *args],
        env={**hermetic(), "PYTHONPATH": str(SRC), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=timeout,
        preexec_fn=become(who),
    )
    assert run.returncode == 0, run.stderr
    return json.loads(run.stdout)


RAW = """
import json, socket, sys
def ask(path, data, wait=10.0):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect(path)
    s.settimeout(wait)
    try:
        s.sendall(data)
    except OSError:
        pass
    got = b""
    try:
        while not got.endswith(b"\\n"):
            chunk = s.recv(1 << 20)
            if not chunk:
                break
            got += chunk
    except OSError:
        pass
    s.close()
    return json.loads(got) if got else None
"""


def test_a_finished_jobs_pid_is_never_signalled_and_a_running_one_is(server: Server) -> None:
    """Root never signals a stored pid number: a finished job's signal is refused, and the
    unrelated process that took its pid lives on; a running job still gets its signal."""
    alice, bob = make_user("alice", ("lab",)), make_user("bob")
    job = submit(server, alice, ["true"])
    server.wait_state(job, ("COMPLETED",))
    journal = st.Store(os.path.join(server.state, "jobs.db"))
    pid = journal.get(job).pid  # type: ignore[union-attr]
    journal.close()
    assert pid
    decoy, since = _take_pid(pid)
    try:
        refused = server.call(alice, "signal", job=job, signal=9)
        assert refused == {"error": f"job {job} has ended (COMPLETED): there is nothing to signal"}
        assert spawn.start_time(pid) == since  # the process with that number lives on
    finally:
        if decoy is not None:
            decoy.kill()
            decoy.wait()
    held = submit(server, alice, ["true"], hold=True)
    assert "has not started" in server.call(alice, "signal", job=held, signal=10)["error"]
    assert "belongs to gw-alice" in server.call(bob, "signal", job=held, signal=2)["error"]
    running = submit(server, alice, ["sleep", "60"])
    server.wait_state(running, ("RUNNING",))
    assert server.call(alice, "signal", job=running, signal=10).get("ok") is True
    row = server.wait_state(running, ("FAILED", "COMPLETED"))
    assert row["signal"] == signal.SIGUSR1
    assert server.call(bob, "hello")["user"] == "gw-bob"


def _take_pid(pid: int) -> tuple[Optional[subprocess.Popen[bytes]], int]:
    """A process of its own session holding `pid` (the worst case: a group of that
    number), made by steering the kernel's next pid; or whoever took it already."""
    for _ in range(300):
        since = spawn.start_time(pid)
        if since >= 0:
            return None, since  # another process has it: it must live on just the same
        with open("/proc/sys/kernel/ns_last_pid", "w") as fh:
            fh.write(str(pid - 1))
        proc = subprocess.Popen(["sleep", "300"], start_new_session=True)
        if proc.pid == pid:
            return proc, spawn.start_time(pid)
        proc.kill()
        proc.wait()
    raise AssertionError(f"pid {pid} could not be taken again")


def test_nested_huge_and_oversized_requests_are_refused_in_one_line(server: Server) -> None:
    alice, bob = make_user("alice", ("lab",)), make_user("bob")
    code = (
        RAW
        + """
path = sys.argv[1]
def submit(**more):
    msg = {"v": 1, "op": "submit", "argv": ["true"], "cwd": "/tmp", "env": {}, **more}
    return ask(path, json.dumps(msg).encode() + b"\\n")
DEEP_END = b"}" * 100 + b"\\n"
print(json.dumps({
    "nested": ask(path, b"[" * 50000 + b"\\n"),
    "deep_object": ask(path, b'{"v":1,"op":"queue","x":' + b'{"a":' * 99 + b"1" + DEEP_END),
    "huge": ask(path, b"x" * (2 << 20)),
    "command": submit(argv=["echo", "x" * 70000]),
    "env": submit(env={"BIG": "x" * 300000}),
    "no_gpu_named": submit(request={"gpus": []}),
}))
"""
    )
    got = as_user(alice, code, server.socket)
    assert got["nested"]["error"] == "message nested 17 deep; the most is 16 (MAX_DEPTH)"
    assert "(MAX_DEPTH)" in got["deep_object"]["error"]
    assert "larger than" in got["huge"]["error"]
    assert got["command"]["error"] == (
        "the command line is 68KiB, over the 64KiB a job may have (service.max_command_bytes)"
    ), got["command"]
    assert "(service.max_env_bytes)" in got["env"]["error"]
    assert "names no GPU" in got["no_gpu_named"]["error"]
    assert server.proc is not None and server.proc.poll() is None
    assert server.call(bob, "hello")["user"] == "gw-bob"


def test_one_user_cannot_hold_every_connection_and_idle_ones_are_closed(
    tmp_path: Path, open_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """520 idle connections from one user: 64 kept (service.max_connections_per_user),
    the rest refused in one line; another user is served; the idle ones, even one that
    sends a byte now and then, are closed after service.idle_timeout."""
    monkeypatch.setenv("GPUWARDEN_SERVICE_IDLE_TIMEOUT", "2")
    alice, bob = make_user("alice", ("lab",)), make_user("bob")
    srv = next(gen := serving(tmp_path, open_dir, monkeypatch))
    try:
        code = """
import json, socket, sys, time
held, refused = [], []
for _ in range(520):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect(sys.argv[1])
    held.append(s)
time.sleep(0.5)
kept = []
for s in held:
    s.settimeout(0.01)
    try:
        line = s.recv(4096)
        refused.append(json.loads(line)["error"]) if line else None
    except socket.timeout:
        kept.append(s)
sys.stdout.write(json.dumps({"kept": len(kept), "refused": sorted(set(refused)),
                             "count": len(refused)}) + "\\n")
sys.stdout.flush()
# Now idle: one of them sends a byte every 0.3 s, which is no request.
deadline, closed = time.monotonic() + 20, 0
for s in kept:
    s.settimeout(0.3)
while kept and time.monotonic() < deadline:
    try:
        kept[0].send(b" ")
    except OSError:
        pass
    for s in list(kept):
        try:
            if s.recv(4096) == b"":
                kept.remove(s)
                closed += 1
        except socket.timeout:
            pass
        except OSError:
            kept.remove(s)
            closed += 1
print(json.dumps({"closed": closed, "open": len(kept)}))
"""
        proc = subprocess.Popen(
            [USER_PY, "-c", code, srv.socket],
            env={**hermetic(), "PYTHONPATH": str(SRC), "PATH": "/usr/bin:/bin"},
            stdout=subprocess.PIPE,
            text=True,
            preexec_fn=become(alice),
        )
        assert proc.stdout is not None
        first = json.loads(proc.stdout.readline())
        assert first["kept"] == 64 and first["count"] == 520 - 64, first
        assert first["refused"] == [
            "you have 64 connections open to the service, the most one user may "
            "(service.max_connections_per_user)"
        ]
        assert srv.call(bob, "hello")["user"] == "gw-bob"  # while alice holds her 64
        out, _ = proc.communicate(timeout=60)
        assert json.loads(out) == {"closed": 64, "open": 0}
        assert srv.call(alice, "hello")["user"] == "gw-alice"
    finally:
        with contextlib.suppress(StopIteration):
            next(gen)


def _journal_with_history(state: str, alice: Person, pending: int, ended: int) -> None:
    """A year of jobs, written before the service starts: `pending` held jobs (two with
    600 KB commands, as an attack would leave them) and `ended` finished ones."""
    journal = st.Store(os.path.join(state, "jobs.db"))
    now = time.time()
    with journal.transaction():
        for i in range(pending + ended):
            argv = ("sh", "-c", "x" * (600_000 if i < 2 else 200))
            journal.add(
                st.new_job(
                    uid=alice.uid,
                    gid=alice.gid,
                    user=alice.name,
                    argv=argv,
                    cwd="/tmp",
                    env={},
                    umask=0o022,
                    request={"count": 1},
                    held=i < pending,
                    state=st.PENDING if i < pending else st.COMPLETED,
                    ended=None if i < pending else now,
                    exit_code=None if i < pending else 0,
                )
            )
    journal.close()


def test_thousands_of_jobs_are_listed_in_pages_and_a_kill_during_listings_loses_nothing(
    tmp_path: Path, open_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """3,000 waiting jobs (two with 600 KB commands) and 4,000 finished ones: every
    answer is one page under PAGE_BYTES; `queue` shows a page and says so, `--all` and
    `jobs --me --all` every row; a client that asks and never reads is dropped without
    growing the service; a `kill -9` during a burst of listings and submits loses none."""
    monkeypatch.setenv("GPUWARDEN_SERVICE_IDLE_TIMEOUT", "2")
    alice, bob = make_user("alice", ("lab",)), make_user("bob")
    srv = Server(tmp_path, open_dir / "work", ())
    _journal_with_history(srv.state, alice, 3000, 4000)
    gen = serving(tmp_path, open_dir, monkeypatch, "--max-jobs-per-user", "100000")
    srv = next(gen)
    try:
        shown = cli_as(srv, alice, "queue")
        assert shown.returncode == 0, shown.stderr
        assert shown.stderr == "gpuwarden queue: 500 of 3000 jobs shown; --all shows every one\n"
        everything = cli_as(srv, alice, "queue", "--all", "--json")
        assert everything.returncode == 0 and len(json.loads(everything.stdout)) == 3000
        mine = cli_as(srv, alice, "jobs", "--me", "--all", "--json")
        assert mine.returncode == 0 and len(json.loads(mine.stdout)) == 4000
        assert len(json.loads(cli_as(srv, bob, "jobs", "--me", "--json").stdout)) == 0
        code = (
            RAW
            + """
path = sys.argv[1]
big = ask(path, b'{"v":1,"op":"queue","limit":5000}\\n')
size = len(json.dumps(big, separators=(",", ":")))
longest = max(len(" ".join(r["command"])) for r in big["jobs"])
print(json.dumps({"rows": len(big["jobs"]), "next": big["next"], "total": big["total"],
                  "size": size, "longest": longest}))
"""
        )
        page = as_user(alice, code, srv.socket)
        assert page["total"] == 3000 and page["next"] == page["rows"] and page["rows"] < 3000
        assert page["size"] <= protocol.PAGE_BYTES + 4096
        assert page["longest"] <= 2048 + 10  # a 600 KB command is cut in a listing

        rss_before = _rss(srv)
        deaf = """
import json, socket, sys, time
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.connect(sys.argv[1])
s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
s.settimeout(5)
try:
    for _ in range(200):
        s.sendall(b'{"v":1,"op":"queue","limit":5000}\\n')
except OSError:
    pass
sys.stdout.write("asked\\n")
sys.stdout.flush()
time.sleep(4)  # reads nothing for twice the idle timeout
answers, closed = 0, False
try:
    while True:
        data = s.recv(1 << 20)
        if not data:
            closed = True
            break
        answers += data.count(b"\\n")
except OSError:
    closed = True
print(json.dumps({"answers": answers, "closed": closed}))
"""
        proc = subprocess.Popen(
            [USER_PY, "-c", deaf, srv.socket],
            env={**hermetic(), "PYTHONPATH": str(SRC), "PATH": "/usr/bin:/bin"},
            stdout=subprocess.PIPE,
            text=True,
            preexec_fn=become(alice),
        )
        assert proc.stdout is not None and proc.stdout.readline() == "asked\n"
        assert srv.call(bob, "hello")["user"] == "gw-bob"  # while it does not read
        assert _rss(srv) - rss_before < 16 << 20, "a client that does not read grew the service"
        deaf_end = json.loads(proc.communicate(timeout=60)[0])
        assert deaf_end["closed"] and deaf_end["answers"] < 10, deaf_end

        burst = [
            subprocess.Popen(
                [USER_PY, "-m", "gpuwarden", *args],
                env={
                    "PYTHONPATH": str(SRC),
                    **hermetic(),
                    "PATH": "/usr/bin:/bin",
                    "GPUWARDEN_SOCKET": srv.socket,
                },
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                preexec_fn=become(alice),
                cwd=str(srv.work),
            )
            for args in (("queue", "--all", "--json"), ("jobs", "--all", "--json")) * 3
        ]
        acknowledged = [submit(srv, alice, ["true"], hold=True) for _ in range(5)]
        srv.kill()
        for proc in burst:
            proc.wait(60)
        srv.start()
        after = srv.call(None, "queue", limit=5000, offset=2900)
        ids = {r["id"] for r in after["jobs"]}
        assert set(acknowledged) <= ids and after["total"] == 3005
        assert srv.call(None, "jobs", limit=1)["total"] == 4000
    finally:
        with contextlib.suppress(StopIteration):
            next(gen)


def _rss(srv: Server) -> int:
    assert srv.proc is not None
    for line in Path(f"/proc/{srv.proc.pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def _serve(state: Path, socket: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=str(SRC), GPUWARDEN_SIM=SPEC)
    return subprocess.run(
        [sys.executable, "-m", "gpuwarden", "serve", "--socket", socket, "--state-dir", str(state)],
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
    )


def _valid_journal(path: Path) -> bytes:
    journal = st.Store(str(path))
    journal.add(
        st.new_job(uid=1, gid=1, user="x", argv=("true",), cwd="/", env={}, umask=18, request={})
    )
    journal.close()
    return path.read_bytes()


DAMAGES = {
    "garbage": lambda good: os.urandom(8192),
    "empty": lambda good: b"",
    "truncated": lambda good: good[: len(good) // 2 + 100],
    "header": lambda good: b"\0" * 100 + good[100:],
}


@pytest.mark.parametrize("damage", sorted(DAMAGES))
def test_a_damaged_journal_is_moved_aside_and_the_service_refuses_to_start(
    tmp_path: Path, damage: str
) -> None:
    state = tmp_path / "state"
    state.mkdir()
    journal = state / "jobs.db"
    bad = DAMAGES[damage](_valid_journal(tmp_path / "good.db"))
    journal.write_bytes(bad)
    done = _serve(state, str(tmp_path / "sock"))
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    assert "moved it to " in done.stderr and "does not start until an admin acts" in done.stderr
    moved = done.stderr.split("moved it to ", 1)[1].split(";", 1)[0]
    assert Path(moved).read_bytes() == bad and not journal.exists()
    assert not (tmp_path / "sock").exists()


def test_a_damaged_journal_stays_refused_until_an_admin_acts(tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir()
    (state / "jobs.db").write_bytes(b"not a journal")
    first = _serve(state, str(tmp_path / "sock"))
    moved = first.stderr.split("moved it to ", 1)[1].split(";", 1)[0]
    for _ in range(2):  # as systemd's Restart=always would, again and again
        again = _serve(state, str(tmp_path / "sock"))
        assert again.returncode == 2 and again.stderr.count("\n") == 1, again.stderr
        assert f"moved to {moved}" in again.stderr and "rm " in again.stderr, again.stderr
        assert not (state / "jobs.db").exists() and not (tmp_path / "sock").exists()
    marker = again.stderr.split("`rm ", 1)[1].split("`", 1)[0]
    Path(marker).unlink()  # the admin starts afresh: the next start serves
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "gpuwarden",
            "serve",
            "--socket",
            str(tmp_path / "sock"),
            "--state-dir",
            str(state),
        ],
        env=dict(os.environ, PYTHONPATH=str(SRC), GPUWARDEN_SIM=SPEC),
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        found = wait_until_running(str(tmp_path / "sock"), 30, alive=lambda: proc.poll() is None)
        assert found["running"], found
    finally:
        proc.terminate()
        proc.wait(30)


@pytest.mark.parametrize("where", ["state", "jobs"])
def test_a_file_where_the_services_folder_goes_is_one_line(tmp_path: Path, where: str) -> None:
    state = tmp_path / "state"
    if where == "state":
        state.write_text("")
    else:
        state.mkdir()
        (state / "jobs").write_text("")
    done = _serve(state, str(tmp_path / "sock"))
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    assert "exists and is not a directory" in done.stderr


def test_a_foreign_or_row_damaged_journal_is_refused(tmp_path: Path) -> None:
    import sqlite3

    state = tmp_path / "state"
    state.mkdir()
    foreign = sqlite3.connect(state / "jobs.db")
    foreign.execute("CREATE TABLE t (x)")
    foreign.commit()
    foreign.close()
    done = _serve(state, str(tmp_path / "sock"))
    assert done.returncode == 2 and "has no schema mark" in done.stderr, done.stderr
    (state / "jobs.db.refused").unlink()  # the admin's act (test_..._until_an_admin_acts)
    _valid_journal(state / "jobs.db")
    db = sqlite3.connect(state / "jobs.db")
    db.execute("UPDATE jobs SET argv = '[not json'")
    db.commit()
    db.close()
    done = _serve(state, str(tmp_path / "sock"))
    assert done.returncode == 2 and "is damaged" in done.stderr and "moved it to" in done.stderr


def test_a_second_service_refuses_to_start(server: Server, tmp_path: Path) -> None:
    bob = make_user("bob")
    same = _serve(Path(server.state), server.socket)
    assert same.returncode == 2 and same.stderr.startswith(
        f"gpuwarden serve: another gpuwarden serve (pid {server.proc.pid}) is using the journal"  # type: ignore[union-attr]
    ), same.stderr
    other_state = _serve(tmp_path / "other", server.socket)
    assert other_state.returncode == 2 and "is using the socket" in other_state.stderr
    assert server.call(bob, "hello")["user"] == "gw-bob"


def test_jobs_that_could_never_run_and_partial_cancels_say_so(server: Server) -> None:
    alice, bob = make_user("alice", ("lab",)), make_user("bob")
    for args, why in (
        (("-g", "99"), "asked for 99 GPUs but this machine has only 4 GPUs"),
        (("--mem", "1000TiB"), "only 80.0GiB in total < 1024000.0GiB asked for"),
        (("--model", "H100"), "model NVIDIA A100-SXM4-80GB does not match 'H100'"),
        (("--gpus", "7"), "unknown GPU '7'"),
    ):
        done = cli_as(server, alice, "submit", *args, "--", "true")
        assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
        assert "this job could never start here: " in done.stderr and why in done.stderr
    waiting = [submit(server, alice, ["true"], hold=True) for _ in "ab"]
    other = submit(server, bob, ["true"], hold=True)
    ended = submit(server, alice, ["true"])
    server.wait_state(ended, ("COMPLETED",))
    done = cli_as(server, alice, "cancel", str(waiting[0]), str(other), str(ended), str(waiting[1]))
    assert done.returncode == 1
    assert done.stdout == f"cancelled: {waiting[0]}, {waiting[1]}\n"
    assert done.stderr.splitlines() == [
        f"gpuwarden cancel: job {other} belongs to gw-bob: only its owner or an admin may "
        "cancel it",
        f"gpuwarden cancel: job {ended} has ended (COMPLETED)",
    ]
    none = cli_as(server, alice, "cancel", str(ended))
    assert none.returncode == 2 and none.stderr == (
        f"gpuwarden cancel: job {ended} has ended (COMPLETED)\n"
    )
    held = cli_as(server, bob, "hold", str(other), str(ended))
    assert held.returncode == 1 and held.stdout == f"held: {other}\n"
    assert held.stderr == (
        f"gpuwarden hold: job {ended} belongs to gw-alice: only its owner or an admin may hold it\n"
    )
    server.call(None, "cancel", jobs=[other])


@pytest.mark.parametrize(
    "args",
    [
        ("submit", "--output", "", "--", "true"),
        ("run", "--gpus", "", "--", "true"),
        ("run", "--model", "", "--", "true"),
        ("run", "--max-util", "50%%", "--", "true"),
        ("sim", "inject", "xid", "-5", "--gpu", "0"),
    ],
)
def test_small_bad_inputs_are_refused_in_one_line(
    cli: Any, sim: Any, args: tuple[str, ...]
) -> None:
    sim()
    done = cli(*args, env={"GPUWARDEN_SOCKET": "/nonexistent/sock"})
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    assert "Traceback" not in done.stderr


def test_a_pidfd_is_taken_only_of_the_supervisors_child_and_signals_nothing_once_it_exited() -> (
    None
):
    """service.jobprocess: the claim checks the parent; an exited process is never signalled,
    even when its number names a live group again."""
    from gpuwarden.service import jobprocess

    child = subprocess.Popen(["sleep", "30"], start_new_session=True)
    try:
        assert jobprocess.claim(child.pid, 1) is None  # not the child of that "supervisor"
        fd = jobprocess.claim(child.pid, os.getpid())
        assert fd is not None and not jobprocess.exited(fd)
        assert jobprocess.signal_group(fd, child.pid, signal.SIGTERM) is True
        assert child.wait(10) == -signal.SIGTERM
        assert jobprocess.exited(fd)
        decoy, since = _take_pid(child.pid)  # the number, and its group, another's now
        try:
            assert jobprocess.signal_group(fd, child.pid, signal.SIGKILL) is False
            assert spawn.start_time(child.pid) == since
        finally:
            if decoy is not None:
                decoy.kill()
                decoy.wait()
        os.close(fd)
    finally:
        child.kill()
        child.wait()


@pytest.mark.parametrize("url", ["file:///etc/passwd", "gopher://x/", "ftp://x/"])
def test_a_service_webhook_that_is_not_http_is_refused_at_start(tmp_path: Path, url: str) -> None:
    env = dict(os.environ, PYTHONPATH=str(SRC), GPUWARDEN_SIM=SPEC, GPUWARDEN_SERVICE_WEBHOOK=url)
    done = subprocess.run(
        [sys.executable, "-m", "gpuwarden", "serve", "--socket", str(tmp_path / "sock"),
         "--state-dir", str(tmp_path / "state")],
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
    )  # fmt: skip
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    assert "is not an http:// or https:// URL" in done.stderr


def test_roots_logs_shows_a_jobs_escape_sequences_as_text(server: Server) -> None:
    """A job's output on an admin's terminal cannot retitle or clear it; its owner and a
    pipe still get the bytes as written."""
    import pty

    alice = make_user("alice", ("lab",))
    nasty = r"printf 'ok\033]0;pwned\007\033[2Jend\n'"
    job = submit(server, alice, ["sh", "-c", nasty], output=str(server.work / "nasty.out"))
    server.wait_state(job, ("COMPLETED",))
    env = dict(os.environ, PYTHONPATH=str(SRC), GPUWARDEN_SOCKET=server.socket)
    pid, fd = pty.fork()
    if pid == 0:
        os.execve(sys.executable, [sys.executable, "-m", "gpuwarden", "logs", str(job)], env)
    seen = b""
    with contextlib.suppress(OSError):
        while chunk := os.read(fd, 4096):
            seen += chunk
    os.waitpid(pid, 0)
    assert b"\x1b" not in seen and b"\x07" not in seen, seen
    assert b"ok\\x1b]0;pwned\\x07\\x1b[2Jend" in seen, seen
    piped = cli_as(server, alice, "logs", str(job))
    assert piped.stdout == "ok\x1b]0;pwned\x07\x1b[2Jend\n", piped
