"""Drains, the drain lock and the XID log in a state directory every user can write
(mode 1777, as the README has admins create it), against a hostile local user.

Files are planted as a real other user (`useradd`, then `runuser`) where ownership
matters; each test says which attack it stops."""

from __future__ import annotations

import json
import os
import pwd
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuwarden.base.errors import UserError
from gpuwarden.health import drain as drains
from gpuwarden.health import judgement, xidlog
from gpuwarden.health.watch import HealthWatch, WatchSettings
from gpuwarden.machine.inventory import read_snapshot
from waiting import wait_for

HOSTILE = "gw-mallory"


@pytest.fixture(scope="module")
def mallory() -> int:
    """The uid of a real unprivileged user (created once)."""
    if os.geteuid() != 0:
        pytest.skip("acting as another user needs root")
    if shutil.which("useradd") is None or shutil.which("runuser") is None:
        pytest.skip("useradd/runuser not found")
    try:
        return pwd.getpwnam(HOSTILE).pw_uid
    except KeyError:
        subprocess.run(
            ["useradd", "--system", "--no-create-home", "--shell", "/bin/sh", HOSTILE],
            check=True,
            capture_output=True,
        )
        return pwd.getpwnam(HOSTILE).pw_uid


@pytest.fixture
def shared(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A 1777 state directory the hostile user can reach, used as the state directory."""
    where = Path(tempfile.mkdtemp(prefix="gw-state-", dir="/tmp"))
    where.chmod(0o1777)
    monkeypatch.setenv("GPUWARDEN_STATE_DIR", str(where))
    yield where
    shutil.rmtree(where, ignore_errors=True)


def as_mallory(*argv: str, **kw: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["runuser", "-u", HOSTILE, "--", *argv],
        check=True,
        capture_output=True,
        text=True,
        timeout=30,
        **kw,  # type: ignore[arg-type]
    )


def plant(path: Path, text: str) -> None:
    """`text` in a file at `path` made by the hostile user."""
    as_mallory("sh", "-c", 'printf "%s" "$1" > "$2"', "sh", text, str(path))


UUID = "GPU-aaaa-0000"


# --- drain records that are not what they claim ------------------------------------------


@pytest.mark.parametrize(
    "kind",
    ["fifo", "symlink-to-dev-zero", "directory", "huge", "dangling-symlink"],
)
def test_a_drain_record_that_is_not_a_small_file_is_an_unreadable_drain(
    mallory: int, shared: Path, kind: str
) -> None:
    # Before: a FIFO blocked every reader for ever; /dev/zero was read without bound.
    path = shared / f"drain.{UUID}.json"
    if kind == "fifo":
        as_mallory("mkfifo", str(path))
    elif kind == "symlink-to-dev-zero":
        as_mallory("ln", "-s", "/dev/zero", str(path))
    elif kind == "dangling-symlink":
        as_mallory("ln", "-s", str(shared / "nowhere"), str(path))
    elif kind == "directory":
        as_mallory("mkdir", str(path))
    else:
        as_mallory("truncate", "-s", "1G", str(path))
    started = time.monotonic()
    found = drains.list_drains()[UUID]
    assert time.monotonic() - started < 5
    # Fail safe: still a drain, saying why and whose file it is (from the kernel).
    assert found.reason.startswith(f"unreadable drain record {path} (owner {HOSTILE})")
    assert found.by == HOSTILE and found.uid == mallory


def test_commands_do_not_hang_on_a_fifo_drain_record(mallory: int, shared: Path, cli, sim) -> None:
    sim("server-8xa100")
    uuid = read_snapshot(processes=False).gpus[2].uuid
    as_mallory("mkfifo", str(shared / f"drain.{uuid}.json"))
    for args in (("drain",), ("status",), ("select", "-g", "8"), ("health",)):
        out = cli(*args, timeout=30)  # TimeoutExpired before the fix
        assert "unreadable drain record" in out.stdout + out.stderr or args[0] == "select", args
    listing = cli("drain").stdout
    assert f"drained by {HOSTILE}" in listing and "it is a FIFO" in listing
    assert cli("select", "-g", "8").returncode != 0  # GPU 2 stays out of service


@pytest.mark.parametrize(
    "body, field",
    [
        ('{"reason": "x", "at": []}', "'at'"),
        ('{"reason": "x", "at": "1700000000"}', "'at'"),
        ('{"reason": "x", "at": NaN}', "'at'"),
        ('{"reason": "x", "at": 1e999}', "'at'"),
        ('{"reason": "x", "at": 1' + "0" * 400 + "}", "'at'"),
        ('{"reason": "x", "at": -5}', "'at'"),
        ('{"reason": 7, "at": 1}', "'reason'"),
        ('{"reason": ["x"], "at": 1}', "'reason'"),
        ('{"reason": "x", "at": 1, "auto": "yes"}', "'auto'"),
        ('["reason", "x"]', "JSON object"),
        ('"just text"', "JSON object"),
        ("[" * 100000, "unreadable"),
        ("\xff\xfe", "unreadable"),
    ],
)
def test_a_drain_record_with_a_wrong_field_is_reported_and_still_drains(
    isolated: Path, body: str, field: str
) -> None:
    state = isolated / "state"
    state.mkdir()
    (state / f"drain.{UUID}.json").write_bytes(body.encode("utf-8", "surrogateescape"))
    found = drains.list_drains()[UUID]  # before: TypeError/ValueError/OverflowError
    assert found.reason.startswith("unreadable drain record"), found.reason
    assert field in found.reason
    assert isinstance(found.at, float)


def test_who_drained_comes_from_the_file_owner_not_its_contents(mallory: int, shared: Path) -> None:
    body = {"reason": "maintenance", "by": "root", "at": time.time(), "uid": 0, "auto": True}
    plant(shared / f"drain.{UUID}.json", json.dumps(body))
    found = drains.list_drains()[UUID]
    assert (found.by, found.uid, found.reason) == (HOSTILE, mallory, "maintenance")
    assert found.who == f"{HOSTILE} (health watch)"  # auto is a claim, said as one


def test_other_users_text_is_escaped_everywhere_it_is_shown(
    mallory: int, shared: Path, cli, sim
) -> None:
    sim("server-8xa100")
    uuid = read_snapshot(processes=False).gpus[1].uuid
    evil = "fine\x1b[2J\x1b[1;1Hall GPUs\rhealthy"
    plant(shared / f"drain.{uuid}.json", json.dumps({"reason": evil, "at": time.time()}))
    for args in (("drain",), ("health",), ("status",)):
        out = cli(*args)
        assert "\x1b" not in out.stdout and "\r" not in out.stdout, args
        assert "fine\\x1b[2J\\x1b[1;1Hall GPUs\\x0dhealthy" in out.stdout, (args, out.stdout)


# --- drain and undrain ---------------------------------------------------------------------


def test_drain_of_an_empty_id_is_an_error(cli, sim) -> None:
    sim("server-8xa100")
    for ids in ([""], ["0,,1"], [" "]):
        out = cli("drain", *ids, "--reason", "x")
        assert out.returncode == 2, (ids, out)  # before: exit 0, drained nothing
        assert "empty GPU ID" in out.stderr
    assert cli("drain").stdout.strip() == "no GPU is drained"


def test_a_planted_temporary_file_does_not_block_a_drain(mallory: int, shared: Path) -> None:
    # Before: the temporary name was `.drain.<UUID>.json.<pid>.tmp`, easy to plant first.
    for pid in (os.getpid(), 1, 2):
        as_mallory("mkfifo", str(shared / f".drain.{UUID}.json.{pid}.tmp"))
    drains.drain(UUID, "ECC")
    assert drains.list_drains()[UUID].reason == "ECC"


def test_old_temporaries_of_killed_writers_are_swept(mallory: int, shared: Path) -> None:
    old, fresh = shared / f".drain.{UUID}.json.1-aa.tmp", shared / f".drain.{UUID}.json.2-bb.tmp"
    theirs = shared / f".drain.{UUID}.json.3-cc.tmp"
    for path in (old, fresh):
        path.write_text("{}")
    plant(theirs, "{}")
    hour_ago = time.time() - 3600
    for path in (old, theirs):
        os.utime(path, (hour_ago, hour_ago))
    drains.drain(UUID, "x")
    assert not old.exists()  # before: never removed
    assert fresh.exists() and theirs.exists()  # a live writer's, and another user's
    old.write_text("{}")
    os.utime(old, (hour_ago, hour_ago))
    drains.undrain(UUID)
    assert not old.exists()


def test_a_held_drain_lock_names_its_holder_and_does_not_stop_root(
    mallory: int, shared: Path
) -> None:
    lock = shared / drains.LOCK_NAME
    drains.drain("GPU-first", "creates the lock")
    holder = subprocess.Popen(
        ["runuser", "-u", HOSTILE, "--", "flock", str(lock), "sleep", "60"],
    )
    try:
        wait_for(
            lambda: str(os.stat(lock).st_ino) in Path("/proc/locks").read_text(),
            20,
            "the holder's lock",
        )
        started = time.monotonic()
        # Whoever else waits for it is told who holds it (before: waited for ever).
        busy = pytest.raises(drains.DrainLockBusy, match=f"held by pid [0-9]+ .*user {HOSTILE}")
        with busy, drains._locked(str(shared), 0.5):
            pass
        assert time.monotonic() - started < 10
        # Root is not stopped by it: it goes on without the lock (the write is atomic).
        started = time.monotonic()
        drains.drain(UUID, "x", lock_timeout=30)
        drains.undrain("GPU-first", lock_timeout=30)
        assert time.monotonic() - started < 2 * drains.ROOT_LOCK_WAIT + 5
        # The health watch goes on without the lock too.
        drains.drain(UUID, "XID 79", auto=True, lock_timeout=0.2, force=True)
        assert drains.list_drains()[UUID].reason == "XID 79"
    finally:
        holder.kill()
        holder.wait()


def test_a_fifo_as_the_drain_lock_is_refused_not_waited_on(mallory: int, shared: Path) -> None:
    as_mallory("mkfifo", str(shared / drains.LOCK_NAME))
    code = (
        "import sys; sys.path.insert(0, sys.argv[1]); from gpuwarden.health import drain\n"
        "from gpuwarden.config import load\n"
        "admins = load().get('service.admins')  # as `gpuwarden drain` hands them down\n"
        "try:\n    drain.drain('GPU-x', 'x', admins=admins)\nexcept Exception as e:\n"
        "    print(e)\n"
        "drain.drain('GPU-y', 'y', force=True, admins=admins)"
    )
    src = str(Path(__file__).resolve().parent.parent / "src")
    admins = Path(tempfile.mkdtemp(prefix="gw-admins-"))  # mallory drains as an admin may
    admins.chmod(0o755)
    (admins / "system.toml").write_text(f'[service]\nadmins = ["{HOSTILE}"]\n')
    (admins / "system.toml").chmod(0o644)
    env = ("env", f"GPUWARDEN_STATE_DIR={shared}", "HOME=/tmp")
    env += (f"GPUWARDEN_SYSTEM_CONFIG={admins / 'system.toml'}",)
    try:
        out = as_mallory(*env, "python3", "-c", code, src).stdout  # before: blocked for ever
    finally:
        shutil.rmtree(admins)
    assert out.strip() == f"refusing drain lock {shared}/drains.lock: it is a FIFO"
    assert set(drains.list_drains()) == {"GPU-y"}  # the watch drains all the same
    drains.drain(UUID, "x")  # root takes the name back
    assert set(drains.list_drains()) == {"GPU-y", UUID}


# --- the XID log -----------------------------------------------------------------------------


def _lines(*items: object) -> str:
    return "".join((x if isinstance(x, str) else json.dumps(x)) + "\n" for x in items)


def test_xid_lines_with_wrong_fields_are_skipped_and_reported(isolated: Path) -> None:
    now = time.time()
    good = {"uuid": UUID, "xid": 79, "index": 0, "at": now}
    log = isolated / "state" / "xids.jsonl"
    log.parent.mkdir()
    log.write_text(
        _lines(
            {"uuid": UUID, "xid": "79", "at": now},
            {"uuid": UUID, "xid": 79, "at": "now"},
            {"uuid": UUID, "xid": 79, "at": float("nan")},
            {"uuid": UUID, "xid": 10**400, "at": now},
            {"uuid": UUID, "xid": True, "at": now},
            {"uuid": ["x"], "xid": 79, "at": now},
            {"uuid": UUID, "xid": 79, "index": "0", "at": now},
            {"clear": 5, "at": now},
            "[1, 2]",
            "not json",
            good,
        )
    )
    problems: list[str] = []
    assert xidlog.xids_seen(problems=problems) == {UUID: (79,)}  # before: ValueError
    assert problems == [
        f"skipped 10 malformed line(s) of the XID log {log} (line 1: 'xid' is not an XID number)"
    ]


def test_an_xid_log_owned_by_another_user_is_not_believed(mallory: int, shared: Path) -> None:
    # Before: mallory created xids.jsonl first and her lines drained all 8 GPUs.
    forged = _lines(*({"uuid": f"GPU-{i}", "xid": 79, "at": time.time()} for i in range(8)))
    plant(shared / "xids.jsonl", forged)
    problems: list[str] = []
    assert xidlog.xids_seen(problems=problems) == {}
    assert problems == [
        f"ignoring the XID log {shared}/xids.jsonl: it belongs to {HOSTILE}, not root "
        "(only the health watch's own log is believed)"
    ]
    # Her own log is hers: root's readers do not read it at all.
    plant(shared / f"xids.{mallory}.jsonl", forged)
    assert xidlog.xids_seen(problems=[]) == {}
    # Root's watch takes its name back and writes its own.
    xidlog.record_xid("GPU-real", 48)
    assert os.stat(shared / "xids.jsonl").st_uid == 0
    assert xidlog.xids_seen() == {"GPU-real": (48,)}


@pytest.mark.parametrize("kind", ["fifo", "dev-zero", "dangling"])
def test_an_unsafe_xid_log_is_refused_and_root_replaces_it(
    mallory: int, shared: Path, kind: str
) -> None:
    log = shared / "xids.jsonl"
    if kind == "fifo":
        as_mallory("mkfifo", str(log))
    else:
        target = "/dev/zero" if kind == "dev-zero" else str(shared / "nowhere")
        as_mallory("ln", "-s", target, str(log))
    problems: list[str] = []
    assert xidlog.xids_seen(problems=problems) == {}  # before: hung, or read without end
    assert problems and problems[0].startswith(f"ignoring the XID log: refusing XID log {log}")
    xidlog.record_xid(UUID, 79)  # before: a dangling symlink made this raise
    assert xidlog.xids_seen() == {UUID: (79,)}
    assert not (shared / "nowhere").exists()


def test_a_huge_xid_log_is_read_by_its_tail(isolated: Path, monkeypatch) -> None:
    monkeypatch.setattr(xidlog, "MAX_LOG", 4096)
    xidlog.record_xid("GPU-old", 13)
    for _ in range(100):
        xidlog.record_xid(UUID, 31)
    problems: list[str] = []
    seen = xidlog.xids_seen(problems=problems)
    assert "GPU-old" not in seen and 0 < len(seen[UUID]) < 100
    assert "reading its last 4096" in problems[0]


def test_a_non_root_reader_believes_root_and_itself_only(mallory: int, shared: Path) -> None:
    xidlog.record_xid("GPU-by-root", 79)
    code = (
        "import sys; sys.path.insert(0, sys.argv[1]); from gpuwarden.health import xidlog\n"
        "xidlog.record_xid('GPU-mine', 13)\n"
        "print(sorted(xidlog.xids_seen(problems=[])))\n"
        "xidlog.clear_xids()\n"  # clears her own log, not root's
        "print(sorted(xidlog.xids_seen(problems=[])))"
    )
    exe = "/usr/bin/python3" if Path("/usr/bin/python3").exists() else "python3"
    src = str(Path(__file__).resolve().parent.parent / "src")
    out = as_mallory(
        "env", f"GPUWARDEN_STATE_DIR={shared}", "HOME=/tmp", exe, "-c", code, src
    ).stdout
    assert out.splitlines() == ["['GPU-by-root', 'GPU-mine']", "['GPU-by-root']"]
    assert os.stat(shared / f"xids.{mallory}.jsonl").st_uid == mallory
    assert xidlog.xids_seen() == {"GPU-by-root": (79,)}  # root does not believe hers


def test_a_service_owning_the_state_directory_writes_the_shared_log(
    mallory: int, shared: Path
) -> None:
    # A service running as its own user (systemd StateDirectory= makes it the owner).
    os.chown(shared, mallory, mallory)
    src = str(Path(__file__).resolve().parent.parent / "src")
    code = (
        "import sys; sys.path.insert(0, sys.argv[1]); from gpuwarden.health import xidlog\n"
        "xidlog.record_xid('GPU-seen-by-service', 79)"
    )
    as_mallory("env", f"GPUWARDEN_STATE_DIR={shared}", "HOME=/tmp", "python3", "-c", code, src)
    assert os.stat(shared / "xids.jsonl").st_uid == mallory
    assert xidlog.xids_seen(problems=[]) == {"GPU-seen-by-service": (79,)}
    # Root writes its own shared log only when it is not the service's name.
    os.chown(shared, 0, 0)
    problems: list[str] = []
    assert xidlog.xids_seen(problems=problems) == {}
    assert "it belongs to gw-mallory, not root" in problems[0]


# --- the health watch ------------------------------------------------------------------------


@pytest.fixture
def machine(sim):
    from gpuwarden.sim import Machine

    sim("server-8xa100")
    return Machine.open()


def test_the_watch_survives_an_unwritable_xid_log_and_still_drains(isolated: Path, machine) -> None:
    state = isolated / "state"
    (state / "xids.jsonl").mkdir(parents=True)  # cannot be replaced, even by root
    said: list[str] = []
    watch = HealthWatch(WatchSettings(policy="drain"), log=said.append)
    uuid = read_snapshot(processes=False).gpus[4].uuid
    watch.on_xid(uuid, 79, 4)  # before: UserError out of the listener, which stopped
    assert any("XID 79 on GPU 4 NOT RECORDED" in line for line in said)
    watch.check(read_snapshot(processes=False))
    assert drains.list_drains()[uuid].auto  # judged from memory, not from the file


def test_the_watch_never_drains_from_lines_someone_else_wrote(
    mallory: int, shared: Path, machine
) -> None:
    gpus = read_snapshot(processes=False).gpus
    forged = _lines(*({"uuid": g.uuid, "xid": 79, "at": time.time()} for g in gpus))
    plant(shared / "xids.jsonl", forged)
    watch = HealthWatch(WatchSettings(policy="drain"), log=lambda line: None)
    found = watch.check(read_snapshot(processes=False))
    assert [f for _, f in found if f.code.startswith("xid-")] == []
    assert drains.list_drains() == {}


def test_a_drain_the_watch_cannot_write_is_said_loudly_and_retried(
    isolated: Path, machine, monkeypatch
) -> None:
    from gpuwarden.files import safefiles

    real = safefiles.write_atomic
    failures = [UserError("cannot write drain record: No space left on device")]

    def full_disk(*args, **kw):
        if failures:
            raise failures.pop()
        return real(*args, **kw)

    monkeypatch.setattr(safefiles, "write_atomic", full_disk)
    said: list[str] = []
    watch = HealthWatch(WatchSettings(policy="drain"), log=said.append)
    uuid = read_snapshot(processes=False).gpus[6].uuid
    watch.on_xid(uuid, 79, 6)
    found = watch.check(read_snapshot(processes=False))
    assert [(g.index, f.code) for g, f in found if f.level == "fatal"] == [(6, "xid-79")]
    assert drains.list_drains() == {}
    assert any("GPU 6 NOT DRAINED" in line and "No space left" in line for line in said)
    # Still judged fatal, so placement keeps off it, and the next poll drains it.
    assert judgement.level(xidlog.judged(read_snapshot(processes=False).gpus)[uuid]) == "fatal"
    watch.check(read_snapshot(processes=False))  # before: never tried again
    assert uuid in drains.list_drains()
    assert any("GPU 6 drained now" in line for line in said)


# --- the catalogue ---------------------------------------------------------------------------


@pytest.mark.parametrize("xid", [13, 31])
def test_xid_advice_says_each_step_once(xid: int) -> None:
    _, action = judgement.describe_xid(xid)
    assert action.count("restart the application") == 1, action
    assert "if it repeats on one GPU only" in action


def test_an_exporter_scrape_survives_hostile_drains_and_xid_lines(
    mallory: int, shared: Path, machine
) -> None:
    # Before: one `xid: "79"` line or `at: []` drain emptied every scrape (and a FIFO hung it).
    from gpuwarden.exporter.metrics import render
    from gpuwarden.exporter.server import ViewCache

    gpus = read_snapshot(processes=False).gpus
    as_mallory("mkfifo", str(shared / f"drain.{gpus[0].uuid}.json"))
    plant(shared / f"drain.{gpus[1].uuid}.json", '{"reason": "x", "at": []}')
    xidlog.record_xid(gpus[2].uuid, 13)
    with open(shared / "xids.jsonl", "a") as log:
        log.write(json.dumps({"uuid": gpus[3].uuid, "xid": "79", "at": []}) + "\n")
    text = render(ViewCache(cache_seconds=0).get())
    drained = [line for line in text.splitlines() if line.startswith("gpuwarden_gpu_drained{")]
    assert sum(line.endswith(" 1.0") for line in drained) == 2
    assert f'uuid="{gpus[2].uuid}"' in text and 'xid="13"' in text and 'xid="79"' not in text
