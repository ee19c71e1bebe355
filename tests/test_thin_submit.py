"""The short `gpuwarden submit` (queueclient.thin, service.argvsubmit) against the full
client, side by side on one service, as a user of it.

Each command line goes once through each: the short one hands it to the service,
which reads it with the full client's own grammar; the full one is `cli.main`. What
each printed, its exit status, and the job each journaled must be the same (the id
and the moment aside). Where the short one cannot stand in, it must step aside
before anything is journaled, and the console script then behaves as the full client.
"""

from __future__ import annotations

import dataclasses
import os
import re
import subprocess
from pathlib import Path
from typing import Any, Optional

import pytest

from gpuwarden.service import store as st
from gpuwarden.service.identity import Person
from hermetic import hermetic
from repo import SRC
from servicetools import USER_PY, Server, become, serving
from users import make_user

# The short client alone: 99 where it steps aside (it never exits 99 itself).
THIN = """
import sys
from gpuwarden.queueclient.thin import submit
code = submit(sys.argv[1:])
sys.exit(99 if code is None else code)
"""
FULL = """
import sys
from gpuwarden.cli import main
sys.exit(main(["submit", *sys.argv[1:]]))
"""
ASIDE = 99

WEBHOOK = "http://127.0.0.1:9/hook"


def environment(srv: Server, **extra: str) -> dict[str, str]:
    return {
        **hermetic(),
        "PYTHONPATH": str(SRC),
        "PATH": "/usr/bin:/bin",
        "GPUWARDEN_SOCKET": srv.socket,
        "GPUWARDEN_SUBMIT_WEBHOOK": WEBHOOK,
        "GPUWARDEN_DEV_DIR": "/dev",
        **extra,
    }


def as_user(
    srv: Server, who: Person, code: str, args: list[str], env: Optional[dict[str, str]] = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [USER_PY, "-c", code, *args],
        env=environment(srv) if env is None else env,
        capture_output=True,
        text=True,
        timeout=60,
        preexec_fn=become(who),
        cwd=str(srv.work),
    )


def journaled(srv: Server, job: int) -> dict[str, Any]:
    """The job as the journal keeps it, less what differs between two submits."""
    journal = st.Store(os.path.join(srv.state, "jobs.db"))
    try:
        found = journal.get(job)
    finally:
        journal.close()
    assert found is not None, job
    row = dataclasses.asdict(found)
    if row["output"]:  # the default names the job: gpuwarden-ID.out
        row["output"] = re.sub(rf"gpuwarden-{job}([._])", r"gpuwarden-ID\1", row["output"])
    for name in ("id", "submitted", "array_job", "state", "reason"):
        row.pop(name)
    return row


def both(srv: Server, who: Person, args: list[str]) -> tuple[Any, Any]:
    """(what the short client did, what the full one did): exit status, output with the
    job's id as ID, and the journaled job (None where nothing was queued)."""
    said = []
    for code in (THIN, FULL):
        done = as_user(srv, who, code, args)
        assert done.returncode != ASIDE, f"the short client stepped aside for {args}"
        job = done.stdout.strip()
        row = journaled(srv, int(job)) if done.returncode == 0 else None
        text = (done.stdout + done.stderr).replace(job, "ID") if job else done.stdout + done.stderr
        said.append((done.returncode, text, row))
    return said[0], said[1]


def differences(thin: Any, full: Any) -> Any:
    if thin[2] is None or full[2] is None:
        return thin, full
    return {k: (v, full[2][k]) for k, v in thin[2].items() if full[2][k] != v}, thin[:2], full[:2]


def test_every_option_journals_the_same_job_through_either_client(server: Server) -> None:
    alice = make_user("alice", ("lab",))
    first = as_user(server, alice, FULL, ["--hold", "--", "true"])
    assert first.returncode == 0, first.stderr
    lines = [
        ["--hold", "-g", "1", "--", "true"],
        ["--hold", "--count", "2", "--", "sh", "-c", "echo $0", "x"],
        ["--hold", "--gpus", "0,1", "--exclude", "1", "--", "true"],
        ["--hold", "--min-free", "10GiB", "--max-util", "50", "--min-capability", "8.0", "x"],
        ["--hold", "--model", "A100", "--mem", "8GiB", "--", "python3", "train.py"],
        ["--hold", "--time", "1:30:00", "--signal", "B:USR1@120", "--", "true"],
        ["--hold", f"--after={first.stdout.strip()}", "--nice", "5", "--", "true"],
        ["--hold", "--notify", "end,fail", "--begin", "2031-01-02T03:04", "--", "true"],
        ["--hold", "--array", "0-7%2", "--", "true"],
        ["--hold", "--param", "lr=1,2", "--param", "seed=3,4", "--array", "%1", "--", "true"],
        ["--hold", "--max-retries", "3", "--preemptible", "--preempt", "cancel", "--", "true"],
        ["--hold", "--preemptible", "--signal", "USR1", "--", "true"],
        ["--hold", "--output", "out/../job.log", "--", "true"],
        ["--hold", "--output=/dev/null", "-g", "0", "--", "true"],
        ["--hold", "--", "docker", "run", "--rm", "img", "nvidia-smi"],
        ["--hold", "true", "--output", "x"],  # the job's own words after its command
        ["--hold", "--account", "nosuch", "--", "true"],  # refused by the service
        ["--hold", "-g", "9", "--", "true"],  # more GPUs than the machine has
    ]
    for args in lines:
        thin, full = both(server, alice, args)
        assert thin == full, (args, differences(thin, full))
    assert both(server, alice, lines[0])[0][2]["request"]["count"] == 1


def test_every_refusal_is_the_same_line_and_status(server: Server) -> None:
    alice = make_user("alice", ("lab",))
    closed = server.work.parent / "closed"
    closed.mkdir(mode=0o755)
    lines = [
        ["-g", "x", "--", "true"],
        ["--bogus", "--", "true"],
        ["--count"],
        ["--preempt", "bogus", "--", "true"],
        ["--hold"],
        ["--nodes", "2", "--", "true"],
        ["--output", " ", "--", "true"],
        ["--output", str(closed / "job.log"), "--", "true"],
        ["--output", str(server.work), "--", "true"],
        ["--nice", "50", "--", "true"],
        ["--preempt", "cancel", "--", "true"],
        ["--signal", "USR1", "--", "true"],
        ["--signal", "NOPE@1", "--time", "5", "--", "true"],
        ["--array", "7-2", "--", "true"],
        ["--param", "lr", "--", "true"],
        ["--after", "x", "--", "true"],
        ["--after", "999999", "--", "true"],
        ["--time", "zz", "--", "true"],
        ["--begin", "someday", "--", "true"],
        ["--notify", "never", "--", "true"],
        ["--min-free", "lots", "--", "true"],
        ["--mem", "0", "--", "true"],
        ["--gpus", " ", "--", "true"],
    ]
    for args in lines:
        thin, full = both(server, alice, args)
        assert thin == full, args
        assert thin[0] != 0 and thin[2] is None, (args, thin)
        assert thin[1].count("\n") <= 2, thin  # one line (argparse's: usage, then the error)
    assert not server.call(None, "queue")["jobs"]  # nothing was queued
    # A bad setting in a variable the client has: the same line from the service.
    env = environment(server, GPUWARDEN_RUN_MAX_UTIL="lots")
    thin = as_user(server, alice, THIN, ["--", "true"], env)
    full = as_user(server, alice, FULL, ["--", "true"], env)
    assert (thin.returncode, thin.stderr) == (full.returncode, full.stderr) != (0, "")


@pytest.mark.parametrize(
    "args",
    [["--dry-run", "--", "true"], ["--help"], ["-g", "1", "--ddp", "--", "train.py"]],
)
def test_what_only_the_full_client_does_is_left_to_it(server: Server, args: list[str]) -> None:
    alice = make_user("alice", ("lab",))
    assert as_user(server, alice, THIN, args).returncode == ASIDE
    console_args = ["-c", "from gpuwarden.cli import console; console()", "submit", *args]
    console = subprocess.run(
        [USER_PY, *console_args],
        env=environment(server),
        capture_output=True,
        text=True,
        timeout=60,
        preexec_fn=become(alice),
        cwd=str(server.work),
    )
    full = as_user(server, alice, FULL, args)
    assert (console.returncode, console.stdout, console.stderr) == (
        full.returncode,
        full.stdout,
        full.stderr,
    )
    assert not server.call(None, "queue")["jobs"]


def test_it_steps_aside_for_settings_files_and_other_services(
    server: Server, tmp_path: Path
) -> None:
    """The user's and the project's settings are read, and trusted, by the full client
    as the user; a socket with no service, or another system file than the service's,
    is the full client's to report."""
    alice = make_user("alice", ("lab",))
    args = ["--hold", "--", "true"]
    xdg = server.work / "xdg"
    (xdg / "gpuwarden").mkdir(parents=True)
    (xdg / "gpuwarden" / "config.toml").write_text("[run]\ncount = 2\n")
    os.chown(xdg / "gpuwarden" / "config.toml", alice.uid, alice.gid)
    aside = as_user(server, alice, THIN, args, environment(server, XDG_CONFIG_HOME=str(xdg)))
    assert (aside.returncode, aside.stdout, aside.stderr) == (ASIDE, "", "")
    project = server.work / "proj"
    project.mkdir()
    (project / "gpuwarden.toml").write_text("[run]\ncount = 3\n")
    inside = subprocess.run(
        [USER_PY, "-c", THIN, *args],
        env=environment(server),
        capture_output=True,
        text=True,
        timeout=60,
        preexec_fn=become(alice),
        cwd=str(project),
    )
    assert inside.returncode == ASIDE, inside.stderr
    nobody = environment(server, GPUWARDEN_SOCKET=str(tmp_path / "none.sock"))
    assert as_user(server, alice, THIN, args, nobody).returncode == ASIDE
    other = environment(server, GPUWARDEN_SYSTEM_CONFIG=str(server.work / "other.toml"))
    assert as_user(server, alice, THIN, args, other).returncode == ASIDE
    assert not server.call(None, "queue")["jobs"]


def test_the_console_script_submits_without_argparse_json_or_socket(server: Server) -> None:
    """What the short path costs is what it imports: none of the modules that cost a
    submit several times the interpreter's start (docs/performance.md)."""
    alice = make_user("alice", ("lab",))
    probe = (
        "import sys\n"
        "from gpuwarden.queueclient.thin import submit\n"
        "code = submit(sys.argv[1:])\n"
        "print(' '.join(sorted(sys.modules)), file=sys.stderr)\n"
    )
    done = as_user(server, alice, probe, ["--hold", "--", "true"])
    assert re.fullmatch(r"\d+\n", done.stdout), done.stderr
    loaded = set(done.stderr.splitlines()[-1].split())
    heavy = {"argparse", "json", "socket", "re", "enum", "selectors", "tomllib", "typing"}
    assert not loaded & heavy, sorted(loaded & heavy)
    settings = {m for m in loaded if m == "gpuwarden.config" or m.startswith("gpuwarden.config.")}
    assert not settings, settings  # the schema and the files' reading are the service's


# What the console script loads for a submit beyond the interpreter's own start: the
# package, the CLI's table, the short client and its three helpers, and two of the
# interpreter's built-in modules. Each module more is a share of a millisecond on
# every submit; `__future__` too (no module on this path imports it).
CONSOLE = "import sys; sys.argv[1:1] = ['submit']; from gpuwarden.cli import console; console()"
SHORT_PATH = {
    "gpuwarden",
    "gpuwarden.cli",
    "gpuwarden.files",
    "gpuwarden.files.configfiles",
    "gpuwarden.queueclient",
    "gpuwarden.queueclient.shortwire",
    "gpuwarden.queueclient.thin",
    "gpuwarden.queueclient.writable",
    "_json",
    "_socket",
}


def imported(srv: Server, who: Person, code: str, args: list[str]) -> set[str]:
    """The modules `code` imports, as `-X importtime` names them."""
    env = {**environment(srv), "PYTHONPROFILEIMPORTTIME": "1"}
    done = as_user(srv, who, code, args, env)
    assert done.returncode == 0, done.stderr
    lines = [line.split("|") for line in done.stderr.splitlines()]
    return {cells[2].strip() for cells in lines if len(cells) == 3 and "imported" not in cells[2]}


def test_the_console_script_loads_only_the_short_path_beyond_the_interpreter(
    server: Server,
) -> None:
    alice = make_user("alice", ("lab",))
    floor = imported(server, alice, "pass", [])
    loaded = imported(server, alice, CONSOLE, ["--hold", "--", "true"])
    assert loaded - floor == SHORT_PATH, sorted(loaded - floor)


def test_a_short_submit_costs_the_service_one_durable_commit_and_no_pass(
    server: Server,
) -> None:
    """The service's work for one held submit from the short client: its argv read, one
    commit and its fsync (the job id answered survives a crash), no start pass and no
    NVML call."""
    alice = make_user("alice", ("lab",))
    server.call(None, "stats")  # the service's first pass is behind it
    before = server.call(None, "stats")
    count = 5
    for _ in range(count):
        reply = raw(
            server,
            alice,
            args=["--hold", "--output", "/dev/null", "--", "true"],
            probes={str(server.work): [True] * 5, "/dev/null": [False, True, True, False, False]},
        )
        assert reply["code"] == 0, reply
    after = server.call(None, "stats")
    journal = {k: after["journal"][k] - before["journal"][k] for k in ("commits", "fsyncs")}
    assert journal == {"commits": count, "fsyncs": count}, journal
    # A held job wakes no start pass (the queue's full pass comes on its own pace).
    assert after["plan"]["starts"] == before["plan"]["starts"], (before["plan"], after["plan"])
    calls = after["machine"]["nvml_calls"] - before["machine"]["nvml_calls"]
    assert calls == 0, calls
    # An output the job's id names is written once the id is known; the default too.
    pattern = str(server.work / "run-%j.log")
    facts = {str(server.work): [True] * 5, pattern: [False, False, False, False, True]}
    named = raw(server, alice, args=["--hold", "--output", pattern, "--", "true"], probes=facts)
    plain = raw(server, alice, args=["--hold", "--", "true"])
    assert journaled(server, named["job"])["output"] == str(server.work / f"run-{named['job']}.log")
    assert journaled(server, plain["job"])["output"] == str(server.work / "gpuwarden-ID.out")


# One request, as it comes, over a raw connection; the answer's line as JSON.
RAW = """
import json, socket, sys
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.connect(sys.argv[1])
s.settimeout(60)
s.sendall(sys.stdin.buffer.read() + b"\\n")
got = b""
while not got.endswith(b"\\n"):
    more = s.recv(65536)
    if not more:
        break
    got += more
print(got.decode() or "{}")
"""


def raw(srv: Server, who: Person, **fields: Any) -> dict[str, Any]:
    import json

    from gpuwarden import __version__

    message = {
        "v": 1,
        "op": "submit_argv",
        "release": __version__,
        "socket": srv.socket,
        "args": ["--hold", "--", "true"],
        "cwd": str(srv.work),
        "env": environment(srv),
        "umask": 0o022,
        "python": USER_PY,
        "probes": {str(srv.work): [True, True, True, True, True]},
        "system_file": False,
        **fields,
    }
    done = subprocess.run(
        [USER_PY, "-c", RAW, srv.socket],
        input=json.dumps(message),
        env=environment(srv),
        capture_output=True,
        text=True,
        timeout=60,
        preexec_fn=become(who),
    )
    assert done.returncode == 0, done.stderr
    return dict(json.loads(done.stdout))


def test_a_hostile_command_line_can_do_no_more_than_a_submit(server: Server) -> None:
    """Each field of `submit_argv` as a user who means harm: refused in one line, or
    handed back to the full client, or worth exactly the `submit` it makes."""
    alice, bob = make_user("alice", ("lab",)), make_user("bob")
    # Root's files are not read for her: another system file is the full client's.
    secret = server.work.parent / "secret.toml"
    secret.write_text("[run]\ncount = 3\n")
    secret.chmod(0o600)
    env = environment(server, GPUWARDEN_SYSTEM_CONFIG=str(secret))
    assert set(raw(server, alice, env=env)) >= {"fallback"}
    # Another socket, another release, --help: nothing is done, nothing printed.
    assert "fallback" in raw(server, alice, socket="/run/elsewhere.sock")
    assert "fallback" in raw(server, alice, release="0.0.1")
    assert "fallback" in raw(server, alice, args=["--help"])
    assert "fallback" in raw(server, alice, args=["--hold", "--output", "x", "--", "true"])
    # A command line argparse would chew on for minutes (quadratic in its options) is
    # not read here: the full client reads it, in her own process.
    assert "fallback" in raw(server, alice, args=["--hold"] * 60000 + ["--", "true"])
    assert "fallback" in raw(server, alice, args=["true", *["-x"] * 8000])
    assert not server.call(None, "queue")["jobs"]
    assert "usage:" not in server.log_tail(20000)
    # Malformed fields: one line each, never a traceback, and nothing queued.
    for bad in (
        {"args": "--hold true"},
        {"args": [1, 2]},
        {"env": {"A": 1}},
        {"env": ["A=1"]},
        {"umask": 0o7777},
        {"cwd": "relative"},
        {"probes": {str(server.work): [True]}},
        {"probes": {str(server.work): ["yes"] * 5}},
        {"python": ""},
        {"args": ["x"] * (70000)},
    ):
        answer = raw(server, alice, **bad)
        assert answer.get("ok") is False and "\n" not in answer["error"], (bad, answer)
        assert "Traceback" not in answer["error"] and "internal" not in answer["error"]
    assert not server.call(None, "queue")["jobs"]
    # Whoever $USER says, the job is hers (SO_PEERCRED), with her limits.
    claimed = environment(server, USER="root", LOGNAME="gw-bob", SUDO_UID="0")
    made = raw(server, alice, env=claimed)
    assert made["code"] == 0, made
    mine = journaled(server, made["job"])
    assert (mine["uid"], mine["user"]) == (alice.uid, alice.name)
    # What it journals is what a `submit` of the same fields journals: a lie about the
    # output's facts is hers alone (the full client's check is hers to skip too).
    closed = server.work.parent / "closed"
    closed.mkdir(mode=0o755)
    lie = raw(
        server,
        alice,
        args=["--hold", "--output", str(closed / "o.log"), "--", "true"],
        probes={str(closed / "o.log"): [False, False, True, True, True]},
    )
    direct = server.call(
        alice,
        "submit",
        argv=["true"],
        cwd=str(server.work),
        env=environment(server),
        umask=0o022,
        request={"count": 1},
        hold=True,
        output=str(closed / "o.log"),
    )
    assert lie["code"] == 0 and "job" in direct, (lie, direct)
    assert journaled(server, lie["job"])["output"] == journaled(server, direct["job"])["output"]
    # Another user's job is not hers to wait on through a command line either.
    theirs = raw(server, bob)["job"]
    after = raw(server, alice, args=["--hold", "--after", str(theirs), "--", "true"])
    directly = server.call(alice, "submit", argv=["true"], cwd=str(server.work), after=[theirs])
    assert (after["code"] == 0) == ("job" in directly), (after, directly)
    assert server.call(None, "stats")["ok"]  # and the service answers on


def test_the_system_file_is_read_as_she_would_read_it(
    tmp_path: Path, open_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The service reads the system settings for her only where she could: a file she
    cannot read, or cannot see, is the full client's to report or to miss."""
    etc = open_dir / "etc"
    etc.mkdir(mode=0o755)
    conf = etc / "config.toml"
    conf.write_text("[run]\ncount = 2\n")
    monkeypatch.setenv("GPUWARDEN_SYSTEM_CONFIG", str(conf))
    started = serving(tmp_path, open_dir, monkeypatch)
    srv = next(started)
    try:
        alice = make_user("alice", ("lab",))
        args = ["--hold", "--", "true"]
        thin, full = both(srv, alice, args)
        assert thin == full and thin[2]["request"]["count"] == 2, (thin, full)
        conf.chmod(0o600)  # root's alone
        assert as_user(srv, alice, THIN, args).returncode == ASIDE
        refused = as_user(srv, alice, FULL, args)
        assert refused.returncode == 2 and "cannot read" in refused.stderr, refused.stderr
        conf.chmod(0o644)
        etc.chmod(0o700)  # she cannot see it: she reads no system file
        assert as_user(srv, alice, THIN, args).returncode == ASIDE
        unseen = as_user(srv, alice, FULL, args)
        assert unseen.returncode == 0, unseen.stderr
        assert journaled(srv, int(unseen.stdout))["request"]["count"] == 1
    finally:
        etc.chmod(0o755)
        next(started, None)


def test_a_service_that_does_not_know_the_request_leaves_it_to_the_full_client(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A service of a release before the short client refuses the unknown operation
    (and closes the connection, as queueclient.protocol has it): nothing was done, so
    the short client steps aside and the full one submits."""
    import socket
    import threading

    from gpuwarden.queueclient import thin

    path = str(tmp_path / "old.sock")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(1)
    heard: list[bytes] = []

    def old_service() -> None:
        conn, _ = listener.accept()
        with conn:
            data = b""
            while not data.endswith(b"\n"):
                data += conn.recv(65536)
            heard.append(data)
            conn.sendall(b'{"v":1,"ok":false,"error":"unknown operation \'submit_argv\'"}\n')

    serving_thread = threading.Thread(target=old_service, daemon=True)
    serving_thread.start()
    monkeypatch.setenv("GPUWARDEN_SOCKET", path)
    monkeypatch.chdir(tmp_path)
    try:
        assert thin.submit(["--hold", "--", "true"]) is None
    finally:
        serving_thread.join(10)
        listener.close()
    assert heard and b'"op":"submit_argv"' in heard[0]


def test_a_reader_that_leaves_is_answered_as_the_full_client_answers_it(
    server: Server,
) -> None:
    """`gpuwarden submit ... | reader` where the reader has gone before the id is
    written: the same exit status and lines as the full client's (a user settings file
    makes the console script run the full client), and the job submitted."""
    alice = make_user("alice", ("lab",))
    xdg = server.work / "xdg"
    (xdg / "gpuwarden").mkdir(parents=True)
    (xdg / "gpuwarden" / "config.toml").write_text("[run]\n")
    os.chown(xdg / "gpuwarden" / "config.toml", alice.uid, alice.gid)
    line = '"$0" -m gpuwarden submit --hold -- true | { exec 0<&-; sleep 1; }'
    said = []
    for extra in ({}, {"XDG_CONFIG_HOME": str(xdg)}):
        done = subprocess.run(
            ["bash", "-c", f"set -o pipefail; {line}", USER_PY],
            env=environment(server, **extra),
            capture_output=True,
            text=True,
            timeout=60,
            preexec_fn=become(alice),
            cwd=str(server.work),
        )
        said.append((done.returncode, re.sub(r"\d+", "N", done.stderr)))
    assert said[0] == said[1], said
    assert len(server.call(None, "queue")["jobs"]) == 2  # each was submitted
