"""The hostile state-file corpus: every file gpuwarden reads from a place others can
write, in every hostile form, under every command that reads it.

Each case plants one file (a lease lock, a lease record, `alloc.lock`, a wait-line
ticket, a drain record, `drains.lock`, an XID log, the simulated machine's state,
a config file, the service socket) in one form (a FIFO, a symlink to /dev/zero, a
dangling symlink, a symlink to another user's file, a directory, a 1 GiB sparse
file, an empty file, binary garbage, JSON of the wrong types, a file another real
user owns, an unreadable file, and for the socket a dead socket), then runs one
command on the simulated 8xA100 server as a real subprocess. The command must end
within its timeout, print no traceback, and either work or fail with exactly one
line, `gpuwarden <command>: ...`; any other line on stderr must be one line that
names the planted file (a warning about it).

Files in the shared directories are planted by a real other user (`gw-mallory`,
made with useradd), as an attacker would; the cases run four at a time. By default
each (file, form) pair meets two of the commands that read the file (all of them
for a file with at most four readers), rotating so that every reader meets a spread
of forms; GPUWARDEN_CORPUS_FULL=1 runs every crossing (about 1,270 cases, minutes),
and GPUWARDEN_CORPUS_ONLY=TEXT only the cases whose id (file/form/command) holds TEXT.
The XID log a user keeps for herself is read as that user (`runuser`), its files
planted by a third (`gw-trent`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Optional

import pytest

from components import require
from pythons import python_for
from repo import SRC
from users import make_user

SPEC = "server-8xa100"
TIMEOUT = 20.0  # seconds per command; a healthy one takes well under 2
WORKERS = 4
# Commands per (file, form) pair unless GPUWARDEN_CORPUS_FULL=1; a file with at most
# ALL_READERS readers meets every one of them.
PER_PAIR = 2
ALL_READERS = 4

# GPU 7 is the one `run -g 1` and `reserve -g 1` choose on an idle server-8xa100, so a
# planted lock or lease there is met head on; GPU 3 is the one the drain case drains.
LEASED_INDEX = 7
DRAINED_INDEX = 3


# --- the commands -----------------------------------------------------------------------

# Each command is one or more invocations run in order in the same case. `reserve`
# is followed by `release` of what it reserved (its ID read from the eval'd output).
COMMANDS: dict[str, tuple[tuple[str, ...], ...]] = {
    "status": (("status",),),
    "status-json": (("status", "--json"),),
    "select": (("select",),),
    "run": (("run", "-g", "1", "--", "true"),),
    "reserve": (("reserve", "-g", "1", "--for", "2m"), ("release",)),
    "drain": (("drain", str(DRAINED_INDEX), "--reason", "corpus"), ("undrain", "3")),
    "health": (("health",),),
    # --no-torch-import: the torch probe is a child process that reads none of these
    # files and costs seconds.
    "doctor": (("doctor", "--no-torch-import"),),
    "exporter": (("exporter", "--once"),),
    "web": (("web", "--once"),),
    "queue": (("queue",),),
    "config": (("config",),),
    "sim-set": (("sim", "set", "--gpu", "2", "util=50"),),  # the simulator's one writer
}

# Commands whose exit status 1 reports findings (a FAIL check, an unhealthy GPU), not
# an error: with it they may print nothing on stderr.
FINDINGS_EXIT = {"doctor", "health"}

EVERY = tuple(c for c in COMMANDS if c != "sim-set")  # every command that loads the config
# What reads each kind of state (the crossings that can apply). Files not read by
# a command are left out of its cases: planting them there tests nothing.
LEASE_READERS = ("run", "reserve", "status", "status-json", "select", "exporter", "web", "doctor")
DRAIN_READERS = (
    "drain",
    "status",
    "status-json",
    "select",
    "run",
    "reserve",
    "health",
    "exporter",
    "web",
)
XID_READERS = ("health", "status", "status-json", "select", "run", "exporter", "web", "drain")
SIM_READERS = (*(c for c in EVERY if c not in ("queue", "config")), "sim-set")  # NVML users


@dataclasses.dataclass(frozen=True)
class Target:
    """One state file: where it lives, what a valid one and one of the wrong types
    hold, and which commands read it."""

    name: str
    where: str  # lease | state | sim | system | user | project | socket
    file: Callable[[dict[int, str]], str]  # its name, given the GPUs' UUIDs by index
    valid: bytes
    wrong: bytes
    readers: tuple[str, ...]
    # Whose commands read it: root (None), or for a per-user log the user it belongs to
    # (`gw-mallory`, then the files are planted by a third user, `gw-trent`).
    reader: Optional[str] = None

    @property
    def shared(self) -> bool:
        """In a directory every user can write (mode 1777): planted by the other user."""
        return self.where in ("lease", "state")


def _lease_record(uuids: dict[int, str]) -> bytes:
    return json.dumps(
        {
            "uuid": uuids[LEASED_INDEX],
            "job": "corpus",
            "pid": 1,
            "command": "train.py",
            "started": time.time(),
        }
    ).encode()


def _ticket_name(_: dict[int, str]) -> str:
    # A name of the right shape, its time now (a crafted early time is a separate
    # case, in test_hostile_leases.py), its pid this test's (alive, not the holder).
    return f"{time.time_ns():020d}-{os.getpid():08d}.1.wait"


def _sim_state() -> bytes:
    from gpuwarden.sim import specs

    return json.dumps(specs.load(SPEC).initial_state()).encode()


def _spec_cache() -> bytes:
    """What the simulator caches of the parsed spec (in this test's own state): made by
    a fresh process, as this one may hold the spec in memory from an earlier test."""
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    code = f"from gpuwarden.sim import specs; specs.load({SPEC!r})"
    subprocess.run([sys.executable, "-c", code], env=env, check=True, timeout=60)
    return (Path(os.environ["GPUWARDEN_SIM_STATE"]) / f".{SPEC}.spec.json").read_bytes()


WRONG_JSON = b'{"uuid": 5, "job": 123, "pid": "x", "mem": -5, "count": "x", "started": []}'

TARGETS: tuple[Target, ...] = (
    Target(
        "lock",
        "lease",
        lambda u: f"{u[LEASED_INDEX]}.lock",
        b"",
        WRONG_JSON,
        LEASE_READERS,
    ),
    Target(
        "lease-record",
        "lease",
        lambda u: f"{u[LEASED_INDEX]}.corpus.lease",
        b"",  # filled in by `_targets` (needs the UUIDs)
        json.dumps(
            {"uuid": [], "job": 123, "pid": "1", "command": 5, "started": "x", "mem": -(2**40)}
        ).encode(),
        LEASE_READERS,
    ),
    Target("alloc-lock", "lease", lambda u: "alloc.lock", b"", WRONG_JSON, ("run", "reserve")),
    Target(
        "ticket",
        "lease",
        _ticket_name,
        json.dumps({"pid": os.getpid(), "since": time.time(), "request": {"count": 1}}).encode(),
        json.dumps(
            {"pid": "x", "since": [], "request": {"count": "x", "gpus": 5, "mem": -1}}
        ).encode(),
        ("run", "reserve", "status", "web"),
    ),
    Target(
        "drain-record",
        "state",
        lambda u: f"drain.{u[DRAINED_INDEX]}.json",
        json.dumps({"reason": "maintenance", "at": time.time()}).encode(),
        json.dumps({"reason": 5, "at": "yesterday", "auto": "yes"}).encode(),
        DRAIN_READERS,
    ),
    Target("drains-lock", "state", lambda u: "drains.lock", b"", WRONG_JSON, ("drain", "health")),
    Target(
        "xid-log",
        "state",
        lambda u: "xids.jsonl",
        b"",  # filled in by `_targets`
        b'{"uuid": 5, "xid": "79", "at": []}\n[1, 2]\n"x"\nnull\n{"clear": 5, "at": "now"}\n',
        XID_READERS,
    ),
    Target(
        "user-xid-log",
        "state",
        lambda u: "xids.{reader}.jsonl",  # the reader's uid, filled in by `run_case`
        b"",  # filled in by `_targets`
        b'{"uuid": [], "xid": -1, "at": "x"}\n{}\n',
        XID_READERS,
        reader="mallory",
    ),
    Target(
        "sim-state",
        "sim",
        lambda u: f"{SPEC}.json",
        b"",  # filled in by `_targets`
        json.dumps({"gpus": 5, "processes": "x", "events": {}, "seq": "x"}).encode(),
        SIM_READERS,
    ),
    Target(
        "sim-lock",
        "sim",
        lambda u: f"{SPEC}.json.lock",
        b"",
        WRONG_JSON,
        ("sim-set",),  # only a change to the machine takes it
    ),
    Target(
        "sim-spec-cache",
        "sim",
        lambda u: f".{SPEC}.spec.json",
        b"",  # filled in by `_targets`
        b'{"key": 5, "spec": {"gpus": 5}}',
        SIM_READERS,
    ),
    Target(
        "system-config",
        "system",
        lambda u: "config.toml",
        b"[run]\ncount = 1\n",
        b'[lease]\ndir = 5\n[run]\ncount = "x"\n[health]\nhook = []\n[exporter]\nlisten = 1.5\n',
        EVERY,
    ),
    Target(
        "user-config",
        "user",
        lambda u: "config.toml",
        b"[run]\ncount = 1\n",
        b'[service]\nsocket = []\n[web]\ninterval = "x"\n[status]\nwatch = {}\n',
        EVERY,
    ),
    Target(
        "project-config",
        "project",
        lambda u: "gpuwarden.toml",
        b"[run]\ncount = 1\n",
        b"run = 5\nlease = []\n",
        EVERY,
    ),
    Target(
        "socket",
        "socket",
        lambda u: "service.sock",
        b"",  # a dead socket: see `plant`
        WRONG_JSON,
        ("queue", "status", "run", "reserve", "web", "doctor", "exporter"),
    ),
)

FORMS = (
    "fifo",
    "symlink-dev-zero",
    "dangling-symlink",
    "symlink-foreign",
    "directory",
    "huge",
    "empty",
    "garbage",
    "wrong-types",
    "foreign-owner",
    "mode-000",
    "dead-socket",  # the socket target only: a socket nobody listens on
)

GARBAGE = bytes(range(256)) * 64 + b"\xff\xfe\x00" * 100


def _targets(uuids: dict[int, str]) -> list[Target]:
    """TARGETS with the valid contents that need the machine's UUIDs."""
    xid_line = json.dumps({"uuid": uuids[1], "xid": 31, "index": 1, "at": time.time()}) + "\n"
    filled = {
        "lease-record": _lease_record(uuids),
        "xid-log": xid_line.encode(),
        "user-xid-log": xid_line.encode(),
        "sim-state": _sim_state(),
        "sim-spec-cache": _spec_cache(),
    }
    return [dataclasses.replace(t, valid=filled.get(t.name, t.valid)) for t in TARGETS]


# --- a case -----------------------------------------------------------------------------


@dataclasses.dataclass
class Case:
    target: Target
    form: str
    command: str

    @property
    def id(self) -> str:
        return f"{self.target.name}/{self.form}/{self.command}"


def cases(targets: Sequence[Target], full: bool) -> list[Case]:
    out = []
    for t in targets:
        for f, form in enumerate(FORMS):
            if form == "dead-socket" and t.where != "socket":
                continue  # only a socket path can meaningfully hold a socket
            chosen = t.readers
            if not full and len(chosen) > ALL_READERS:
                # Rotate so each reader meets a spread of forms across the pairs.
                start = (f * PER_PAIR + len(t.name)) % len(chosen)
                chosen = tuple(chosen[(start + j) % len(chosen)] for j in range(PER_PAIR))
            out.extend(Case(t, form, c) for c in chosen)
    return out


class Layout:
    """A case's own directories: shared lease and state directories (1777, root's),
    the simulated machine's state, the three config files' homes, a working directory
    and the service socket's place."""

    def __init__(self, base: Path, reader: Optional[int] = None) -> None:
        self.base = base
        self.leases = base / "leases"
        self.state = base / "state"
        self.sim = base / "sim"
        self.etc = base / "etc"
        self.xdg = base / "xdg"
        self.cwd = base / "cwd"
        self.run_dir = base / "run"
        self.elsewhere = base / "elsewhere"  # the other user's own files
        for d in (self.leases, self.state):
            d.mkdir(parents=True)
            d.chmod(0o1777)
        for d in (self.sim, self.etc, self.xdg / "gpuwarden", self.cwd, self.run_dir):
            d.mkdir(parents=True)
        self.elsewhere.mkdir()
        if reader is not None:  # the reader's own places
            for d in (self.sim, self.xdg, self.xdg / "gpuwarden", self.cwd, self.run_dir):
                os.chown(d, reader, reader)

    def folder(self, where: str) -> Path:
        return {
            "lease": self.leases,
            "state": self.state,
            "sim": self.sim,
            "system": self.etc,
            "user": self.xdg / "gpuwarden",
            "project": self.cwd,
            "socket": self.run_dir,
        }[where]

    def env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("GPUWARDEN_")}
        env.update(
            GPUWARDEN_SIM=SPEC,
            GPUWARDEN_LEASE_DIR=str(self.leases),
            GPUWARDEN_STATE_DIR=str(self.state),
            GPUWARDEN_SIM_STATE=str(self.sim),
            GPUWARDEN_SYSTEM_CONFIG=str(self.etc / "config.toml"),
            XDG_CONFIG_HOME=str(self.xdg),
            GPUWARDEN_SOCKET=str(self.run_dir / "service.sock"),
            PYTHONPATH=os.pathsep.join(p for p in (str(SRC), os.environ.get("PYTHONPATH")) if p),
        )
        return env


def plant(path: Path, form: str, target: Target, layout: Layout, other: int) -> None:
    """Make `path` the hostile `form`; in a shared directory the other user owns it."""
    if form == "fifo":
        os.mkfifo(path)
    elif form == "symlink-dev-zero":
        os.symlink("/dev/zero", path)
    elif form == "dangling-symlink":
        os.symlink(layout.elsewhere / "nowhere", path)
    elif form == "symlink-foreign":
        theirs = layout.elsewhere / path.name
        theirs.write_bytes(target.valid)
        os.chown(theirs, other, other)
        os.symlink(theirs, path)
    elif form == "directory":
        path.mkdir()
    elif form == "huge":
        with open(path, "wb") as f:
            f.truncate(1 << 30)  # sparse: no disk used
    elif form == "dead-socket":
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.bind(str(path))
        s.close()
    else:
        data = {"empty": b"", "garbage": GARBAGE, "wrong-types": target.wrong}.get(
            form, target.valid
        )
        path.write_bytes(data)
        path.chmod(0o000 if form == "mode-000" else 0o644)
    if form == "foreign-owner" or target.shared:
        os.lchown(path, other, other)


# What `reserve` prints for the shell to eval, and the holder it leaves running.
RESERVATION_RE = re.compile(r"GPUWARDEN_RESERVATION=['\"]?([\w-]+)")
HOLDER_RE = re.compile(r"holder pid (\d+)")


def judge(case: Case, argv: Sequence[str], proc: subprocess.CompletedProcess[str], name: str):
    """What is wrong with one invocation's result, or None."""
    cmd = argv[0]
    out = proc.stdout + proc.stderr
    if "Traceback" in out:
        return f"traceback:\n{proc.stderr[-3000:]}"
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    for ln in lines:
        if not ln.startswith("gpuwarden"):
            return f"a stderr line not from gpuwarden (a message of several lines?): {ln!r}"
    warnings = [ln for ln in lines if name in ln]
    others = [ln for ln in lines if name not in ln]
    if proc.returncode == 0 or (proc.returncode == 1 and case.command in FINDINGS_EXIT):
        bad = [ln for ln in others if not ln.startswith(f"gpuwarden {cmd}:")]
        return f"stray stderr lines: {bad}" if bad else None
    if proc.returncode < 0:
        return f"killed by signal {-proc.returncode}: {proc.stderr[-2000:]}"
    # A failure: exactly one error line (it may name the file), after any warnings.
    errors = others or warnings[-1:]
    if len(errors) != 1 or not errors[0].startswith(f"gpuwarden {cmd}:"):
        return f"exit {proc.returncode} without one clear error line: {lines}"
    return None


def run_case(case: Case, root: Path, number: int, uuids: dict[int, str], people: People):
    """Plant, run the case's command(s), and return (case, problem or None, seconds)."""
    reader = people.uids[case.target.reader] if case.target.reader else None
    layout = Layout(root / f"c{number:04d}", reader)
    name = case.target.file(uuids).replace("{reader}", str(reader))
    path = layout.folder(case.target.where) / name
    other = people.uids["trent" if reader is not None else "mallory"]
    plant(path, case.form, case.target, layout, other)
    env = layout.env()
    python = [sys.executable]
    if reader is not None:
        python = ["runuser", "-u", f"gw-{case.target.reader}", "--", *people.python]
        env["PYTHONPATH"] = people.path
    started = time.monotonic()
    holders: list[int] = []
    problem = None
    reservation: Optional[str] = None
    for argv in COMMANDS[case.command]:
        if argv == ("release",):
            if reservation is None:
                break  # the reserve failed cleanly: nothing to release
            argv = ("release", reservation)
        try:
            proc = subprocess.run(
                [*python, "-m", "gpuwarden", *argv],
                env=env,
                cwd=layout.cwd,
                capture_output=True,
                text=True,
                timeout=TIMEOUT,
                stdin=subprocess.DEVNULL,
                errors="replace",
            )
        except subprocess.TimeoutExpired:
            problem = f"`gpuwarden {' '.join(argv)}` hung for {TIMEOUT:g}s"
            break
        if argv[0] == "reserve":
            found = RESERVATION_RE.search(proc.stdout)
            reservation = found.group(1) if found else None
            holders += [int(p) for p in HOLDER_RE.findall(proc.stderr)]
        problem = judge(case, argv, proc, name)
        if problem:
            problem = f"`gpuwarden {' '.join(argv)}`: {problem}"
            break
    for pid in holders:  # a holder the release did not end (we started it)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGTERM)
    return case, problem, time.monotonic() - started


@dataclasses.dataclass
class People:
    """The real users of the corpus, by short name: `mallory` plants files in the shared
    directories and reads her own XID log; `trent` plants hers. `python` and `path`:
    the interpreter and module path she runs gpuwarden with."""

    uids: dict[str, int]
    python: list[str]
    path: str


@pytest.fixture
def reachable() -> Iterator[Path]:
    """A directory the corpus' other users can reach (pytest's own is root's, 0700)."""
    where = Path(tempfile.mkdtemp(prefix="gw-corpus-", dir="/tmp"))
    where.chmod(0o755)
    yield where
    shutil.rmtree(where, ignore_errors=True)


def test_hostile_state_files_leave_every_command_working_or_failing_clearly(
    reachable: Path, sim: Callable[[str], str]
) -> None:
    # Planting as other real users (and reading as one) needs root and useradd.
    uids = {n: make_user(n).uid for n in ("mallory", "trent")}
    require(shutil.which("runuser") is not None, "runuser (util-linux) is not installed")
    people = People(uids, *python_for("gw-mallory"))
    sim(SPEC)
    from gpuwarden.machine.inventory import read_snapshot

    uuids = {g.index: g.uuid for g in read_snapshot(processes=False).gpus}
    full = os.environ.get("GPUWARDEN_CORPUS_FULL") == "1"
    todo = cases(_targets(uuids), full)
    only = os.environ.get("GPUWARDEN_CORPUS_ONLY")  # a part of case ids, to look into one
    if only:
        todo = [c for c in todo if only in c.id]
    started = time.monotonic()
    with ThreadPoolExecutor(WORKERS) as pool:
        results = list(
            pool.map(lambda nc: run_case(nc[1], reachable, nc[0], uuids, people), enumerate(todo))
        )
    took = time.monotonic() - started
    failed = [(c.id, p) for c, p, _ in results if p]
    slowest = max(results, key=lambda r: r[2])
    print(
        f"\nhostile corpus: {len(results)} cases ({len(TARGETS)} files x {len(FORMS)} forms x "
        f"their readers), {len(failed)} failed, {took:.0f}s; slowest {slowest[0].id} "
        f"{slowest[2]:.1f}s"
    )
    assert not failed, "\n".join([*(i for i, _ in failed), *(f"{i}: {p}" for i, p in failed)])
    assert len(results) >= 300 or full or only


@pytest.mark.parametrize("full", [False, True])
def test_every_file_form_and_reader_is_crossed(full: bool) -> None:
    # The rotation must not leave a reader or a form out of a file's cases.
    uuids = {i: f"GPU-{i:08d}-0000-0000-0000-000000000000" for i in range(8)}
    got = cases(TARGETS, full)
    for t in TARGETS:
        mine = [c for c in got if c.target.name == t.name]
        assert {c.command for c in mine} == set(t.readers), t.name
        forms = set(FORMS) - ({"dead-socket"} if t.where != "socket" else set())
        assert {c.form for c in mine} == forms, t.name
        assert t.file(uuids)


def _ask_a_silent_socket(path: str, timeout: float) -> tuple[str, float]:
    """(the error line, seconds waited) of a `queue` asked of a socket someone listens
    on but never answers: a wedged service, or an impostor."""
    import time

    from gpuwarden.base.errors import UserError
    from gpuwarden.queueclient import client

    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as listener:
        listener.bind(path)
        listener.listen(1)
        conn = client.connect(path, timeout=timeout)
        assert conn is not None
        began = time.monotonic()
        with conn, pytest.raises(UserError) as err:
            conn.call("queue")
        return str(err.value), time.monotonic() - began


def test_a_silent_service_is_named_on_stderr_before_the_timeout_ends(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A command waiting on a wedged service says so after NOTICE_AFTER seconds, once,
    instead of sitting silent for the whole timeout; the timeout itself is unchanged."""
    from gpuwarden.queueclient import client

    monkeypatch.setattr(client, "NOTICE_AFTER", 0.2)
    path = str(tmp_path / "silent.sock")
    line, waited = _ask_a_silent_socket(path, 0.6)
    assert 0.55 <= waited < 5
    assert line == f"lost the connection to the service at {path}: no answer within 0.6s"
    assert capsys.readouterr().err == (
        f"gpuwarden: the service at {path} has not answered for 0.2s; waiting up to 0.6s\n"
    )


def test_a_service_socket_that_never_answers_fails_in_one_line_naming_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Not in the corpus above, whose clients wait the service's full 30 s. Before, the
    # line ended in "None" (a timeout has no strerror) and did not name the socket. A
    # timeout shorter than the notice's delay gives the line alone.
    path = str(tmp_path / "silent.sock")
    line, _ = _ask_a_silent_socket(path, 0.2)
    assert line == f"lost the connection to the service at {path}: no answer within 0.2s"
    assert capsys.readouterr().err == ""
