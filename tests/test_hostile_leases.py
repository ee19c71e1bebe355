"""The shared lease directory against a hostile local user.

The README has admins make /var/lib/gpuwarden/leases mode 1777, so any local user
can put any file there, hold any lock on it, and write anything in it. Other users'
files are made here as root and handed to real Unix users made with `useradd`;
their locks are held by processes running as those users (fork + setuid). Tests
skip with the reason when not root.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import pwd
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

import gpuwarden.leases as lease
from gpuwarden.base.errors import UserError
from gpuwarden.files.safefiles import owner_name
from gpuwarden.jobs import allocation
from gpuwarden.leases import dir as leasedir
from gpuwarden.leases import holders
from gpuwarden.machine.inventory import Snapshot
from gpuwarden.placement.request import Request
from machines import card, idle_a100s
from smalldisk import fill, small_disk
from waiting import wait_for

GiB = 2**30
UUID0 = card(0).uuid


def take(snap: Snapshot, **req: object) -> lease.Held:
    held = allocation.acquire(Request(**req), snapshot=lambda: snap, wait=False, timeout=None)
    held.publish(os.getpid(), "test job")
    return held


def _user(name: str, fallback: int) -> int:
    try:
        return pwd.getpwnam(name).pw_uid
    except KeyError:
        pass
    r = subprocess.run(["useradd", "-M", "-s", "/usr/sbin/nologin", name], capture_output=True)
    try:
        return pwd.getpwnam(name).pw_uid
    except KeyError:
        # useradd unavailable or /etc/passwd locked: a uid without a name is as foreign.
        assert r.returncode != 0
        return fallback


@pytest.fixture
def users() -> tuple[int, int]:
    """(mallory, alice): the hostile user and a bystander, as uids."""
    if os.geteuid() != 0:
        pytest.skip("needs root: makes Unix users and runs processes as them")
    return _user("gwl-mallory", 23001), _user("gwl-alice", 23002)


@pytest.fixture
def shared(tmp_path: Path) -> Path:
    """The lease directory made as the README says: root's, mode 1777."""
    d = tmp_path / "leases"
    d.mkdir()
    os.chmod(d, 0o1777)
    return d


@pytest.fixture
def procs() -> Iterator[list[int]]:
    started: list[int] = []
    yield started
    for pid in started:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, 0)


def as_user(uid: int, procs: list[int], path: Path | None = None, how: int = 0) -> int:
    """A process running as `uid` that holds `path` open (locked with `how` when given)
    until killed; its pid. The file is opened as root first: the test's directories
    are not open to other users."""
    fd = os.open(path, os.O_RDWR | os.O_NONBLOCK) if path is not None else -1
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        try:
            os.setgroups([])
            os.setgid(uid)
            os.setuid(uid)
            if how:
                fcntl.flock(fd, how)
            os.write(w, b"k")
            while True:
                signal.pause()
        finally:
            os._exit(0)
    procs.append(pid)
    os.close(w)
    if fd >= 0:
        os.close(fd)
    assert os.read(r, 1) == b"k"
    os.close(r)
    return pid


def record(path: Path, uid: int, **fields: object) -> Path:
    meta = {
        "uuid": UUID0,
        "index": 0,
        "pid": 1,
        "command": "train.py",
        "started": time.time(),
        "mem": None,
        "job": path.name.split(".")[1],
        "expires": None,
    }
    meta.update(fields)
    path.write_text(json.dumps(meta))
    os.chown(path, uid, uid)
    return path


def sim_uuids() -> list[str]:
    from gpuwarden.machine.inventory import read_snapshot

    return [g.uuid for g in read_snapshot().gpus]


def one_line_error(r: subprocess.CompletedProcess[str]) -> str:
    assert r.returncode != 0
    assert "Traceback" not in r.stderr, r.stderr
    lines = [ln for ln in r.stderr.splitlines() if ln.startswith("gpuwarden")]
    assert lines, r.stderr
    return r.stderr


# --- FIFOs, devices, huge files ----------------------------------------------------------------


def test_fifos_named_like_records_do_not_hang_anyone(sim, cli, shared) -> None:
    sim("server-8xa100")
    uuids = sim_uuids()
    os.mkfifo(shared / f"{uuids[0]}.job1.lease")
    os.mkfifo(shared / f"{time.time_ns():020d}-00000001.1.wait")
    r = cli("run", "-g", "1", "--", "true", timeout=30)
    assert r.returncode == 0, r.stderr
    assert "FIFO" in r.stderr  # said once, on one line
    assert cli("status", timeout=30).returncode == 0
    assert cli("select", "-n", "1", timeout=30).returncode in (0, 2)
    r = cli("run", "-g", "1", "--wait", "--timeout", "5s", "--", "true", timeout=30)
    assert r.returncode == 0, r.stderr


@pytest.mark.parametrize("name", ["alloc.lock", "GPU.lock"])
def test_a_fifo_as_a_lock_file_is_refused_not_waited_on(sim, cli, shared, name) -> None:
    sim("server-8xa100")
    for uuid in sim_uuids() if name == "GPU.lock" else ["alloc"]:
        os.mkfifo(shared / f"{uuid}.lock")
    r = cli("run", "-g", "1", "--", "true", timeout=30)
    assert "it is a FIFO" in one_line_error(r)


def test_devices_and_huge_files_named_like_records(users, shared, procs, capsys) -> None:
    mallory, _ = users
    snap = idle_a100s(2)
    os.mknod(shared / f"{snap.gpus[0].uuid}.zero.lease", 0o644 | 0o020000, os.makedev(1, 5))
    os.symlink("/dev/zero", shared / f"{snap.gpus[0].uuid}.link.lease")
    os.symlink("/dev/zero", shared / f"{time.time_ns():020d}-{os.getpid():08d}.1.wait")
    big = shared / f"{snap.gpus[1].uuid}.big.lease"
    with open(big, "wb") as fh:
        fh.truncate(1 << 30)  # sparse: 1 GiB of zeros to whoever reads it all
    os.chown(big, mallory, mallory)
    as_user(mallory, procs, big, fcntl.LOCK_EX)
    [info] = lease.list_leases()
    # Held, but not a record we can read: its GPU counts as taken, never as free.
    assert info.uuid == snap.gpus[1].uuid and info.mem is None and "unreadable" in info.user
    held = take(snap, count=1, keep_first_last=False)
    assert held.uuids == (snap.gpus[0].uuid,)
    held.release()
    err = capsys.readouterr().err
    assert "character device" in err and "big.lease" in err and "symbolic link" in err


# --- wrong types --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "fields",
    [
        {"job": 123},
        {"mem": -60 * GiB},
        {"mem": 0},
        {"mem": True},
        {"mem": "1"},
        {"pid": "x"},
        {"pid": 0},
        {"pid": -1},
        {"started": "yesterday"},
        {"started": float("nan")},
        {"uuid": "GPU-11111111-0000-0000-0000-000000000000"},
        {"index": "0"},
        {"command": ["rm", "-rf"]},
        {"expires": "never"},
    ],
    ids=repr,
)
def test_a_bad_field_skips_the_record_but_keeps_its_gpu_taken(
    users, shared, procs, capsys, fields
) -> None:
    mallory, _ = users
    snap = idle_a100s(1)
    ours = take(snap, count=1, mem=60 * GiB)  # a colleague's 60 GiB shared lease
    path = record(shared / f"{UUID0}.evil.lease", mallory, mem=60 * GiB, pid=4242)
    # mallory's record with one bad field, under her shared lock on the GPU
    fd = os.open(shared / f"{UUID0}.lock", os.O_RDONLY)
    as_user(mallory, procs, shared / f"{UUID0}.lock", fcntl.LOCK_SH)
    os.close(fd)
    path.write_text(json.dumps({**json.loads(path.read_text()), **fields}))
    as_user(mallory, procs, path, fcntl.LOCK_EX)
    for _ in range(2):
        leases = lease.list_leases()
        assert [i.job for i in leases if i.job == ours.job] == [ours.job]
        [bad] = [i for i in leases if i.job != ours.job]
        assert bad.mem is None and "unreadable" in bad.user
    with pytest.raises(UserError) as err:
        take(snap, count=1, mem=60 * GiB)  # 2 x 60 GiB must not land on the 80 GiB card
    assert err.value.exit_code == lease.EXIT_BUSY
    warnings = [ln for ln in capsys.readouterr().err.splitlines() if "evil.lease" in ln]
    assert len(warnings) == 1, warnings  # reported once per process
    ours.release()


def test_another_users_command_line_is_escaped(users, shared, procs) -> None:
    mallory, _ = users
    path = record(shared / f"{UUID0}.esc.lease", mallory, command="ok\x1b[2J\x1b]0;pwned\x07")
    as_user(mallory, procs, path, fcntl.LOCK_EX)
    [info] = lease.list_leases()
    assert "\x1b" not in info.command and "\x07" not in info.command
    assert info.command.startswith("ok\\x1b[2J")


# --- release ----------------------------------------------------------------------------------


def test_release_never_signals_a_pid_read_from_a_file(sim, cli, users, shared, procs) -> None:
    sim("server-8xa100")
    mallory, alice = users
    victims = {
        "another user's process": as_user(alice, procs),
        "root's own process": as_user(0, procs),
        "mallory's unrelated process": as_user(mallory, procs),
    }
    for n, (what, victim) in enumerate(victims.items()):
        path = record(shared / f"{UUID0}.res-0000000{n}.lease", mallory, pid=victim)
        as_user(mallory, procs, path, fcntl.LOCK_EX)  # the lock is held: a "live" lease
        r = cli("release", f"res-0000000{n}")
        assert "not signalling" in one_line_error(r), what
        assert os.waitpid(victim, os.WNOHANG) == (0, 0), f"{what} was killed"


def test_release_of_a_real_reservation_by_root_still_works(sim, cli) -> None:
    sim("server-8xa100")
    r = cli("reserve", "-g", "1")
    assert r.returncode == 0, r.stderr
    [info] = lease.list_leases()
    assert cli("release", info.job).returncode == 0
    assert lease.list_leases() == []


@pytest.mark.parametrize("wanted", ["", "  ", "\t"])
def test_release_of_an_empty_id_is_an_error(sim, cli, wanted) -> None:
    sim("server-8xa100")
    r = cli("reserve", "-g", "1")
    assert r.returncode == 0, r.stderr
    try:
        assert "empty reservation ID" in one_line_error(cli("release", wanted))
        assert len(lease.list_leases()) == 1  # still held
    finally:
        cli("release")


# --- locks held, stopped waiters, crafted tickets ----------------------------------------------


def test_allocation_lock_held_by_another_user(sim, cli, users, shared, procs) -> None:
    sim("server-8xa100")
    mallory, _ = users
    (shared / "alloc.lock").touch()
    os.chown(shared / "alloc.lock", mallory, mallory)
    holder = as_user(mallory, procs, shared / "alloc.lock", fcntl.LOCK_EX)
    started = time.monotonic()
    r = cli("run", "-g", "1", "--wait", "--timeout", "2s", "--", "true", timeout=60)
    assert r.returncode == lease.EXIT_BUSY, r.stderr
    assert time.monotonic() - started < 30
    assert f"{owner_name(mallory)} pid {holder}" in one_line_error(r)
    r = cli("run", "-g", "1", "--", "true", timeout=60)  # without --wait: a bounded try
    assert r.returncode == lease.EXIT_BUSY and f"pid {holder}" in r.stderr


def _ticket_names(d: Path) -> list[str]:
    return [n for n in os.listdir(d) if n.endswith(".wait")]


def test_a_stopped_waiter_does_not_hold_the_line(sim, cli, shared) -> None:
    sim("server-8xa100")
    assert cli("reserve", "-g", "1").returncode == 0
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).parent.parent / "src"))
    big = subprocess.Popen(
        [sys.executable, "-m", "gpuwarden", "run", "-g", "8", "--wait", "--", "true"],
        env=env,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_for(lambda: _ticket_names(shared) or big.poll() is not None, 30, "the waiter's ticket")
        assert big.poll() is None
        os.kill(big.pid, signal.SIGSTOP)  # Ctrl-Z
        wait_for(lambda: holders.is_stopped(big.pid), 30, "the waiter stopped")
        r = cli("run", "-g", "1", "--", "true", timeout=30)
        assert r.returncode == 0, r.stderr
        assert "stopped waiter" in r.stderr
        r = cli("run", "-g", "1", "--wait", "--timeout", "20s", "--", "true", timeout=60)
        assert r.returncode == 0, r.stderr
        os.kill(big.pid, signal.SIGCONT)  # resumed: back in its place, first in line
        wait_for(lambda: not holders.is_stopped(big.pid), 30, "the waiter resumed")
        r = cli("run", "-g", "1", "--", "true", timeout=30)
        assert r.returncode == lease.EXIT_BUSY and "first in line" in r.stderr
        assert "waiting in line" in r.stderr
    finally:
        big.kill()
        big.wait()
        cli("release")


def _ticket(d: Path, uid: int, procs: list[int], make: Callable[[int], tuple]) -> None:
    """A ticket held locked by a process of `uid`; `make(holder pid)` gives its
    (key, need, contents)."""
    tmp = d / ".crafted"
    tmp.write_text("{}")
    os.chown(tmp, uid, uid)
    pid = as_user(uid, procs, tmp, fcntl.LOCK_EX)
    key, need, data = make(pid)
    tmp.write_text(data if isinstance(data, str) else json.dumps(data))
    os.rename(tmp, d / f"{key}.{need}.wait")


def _request(count: int) -> dict[str, object]:
    """A ticket's request as `join` writes it (placement.requestwire's wire form)."""
    return {"count": count}


CRAFTED: dict[str, Callable[[int], tuple]] = {
    "ancient key": lambda pid: (
        f"{1:020d}-{pid:08d}",
        8,
        {"pid": pid, "since": 1.0, "request": _request(8)},
    ),
    "pid not the holder": lambda pid: (
        f"{time.time_ns():020d}-{1:08d}",
        8,
        {"pid": 1, "since": time.time(), "request": _request(8)},
    ),
    "count disagrees": lambda pid: (
        f"{time.time_ns():020d}-{pid:08d}",
        1,
        {"pid": pid, "since": time.time(), "request": _request(8)},
    ),
    "bad request": lambda pid: (
        f"{time.time_ns():020d}-{pid:08d}",
        8,
        {"pid": pid, "since": time.time(), "request": {"count": "all", "gpus": 7}},
    ),
    "nested too deep": lambda pid: (
        f"{time.time_ns():020d}-{pid:08d}",
        8,
        '{"pid": ' + str(pid) + ', "x": ' + "[" * 50_000,
    ),
    "more GPUs than exist": lambda pid: (
        f"{time.time_ns():020d}-{pid:08d}",
        9999,
        {"pid": pid, "since": time.time(), "request": _request(9999)},
    ),
}


@pytest.mark.parametrize("case", [*CRAFTED, "genuine"])
def test_crafted_tickets_do_not_block_the_line(sim, cli, users, shared, procs, case) -> None:
    sim("server-8xa100")
    mallory, _ = users
    genuine = lambda pid: (  # noqa: E731
        f"{time.time_ns():020d}-{pid:08d}",
        2,
        {"pid": pid, "since": time.time(), "request": _request(2)},
    )
    _ticket(shared, mallory, procs, CRAFTED.get(case, genuine))
    r = cli("run", "-g", "1", "--", "true", timeout=30)
    if case == "genuine":  # a real waiter, running, for what the machine has: it comes first
        assert r.returncode == lease.EXIT_BUSY, r.stderr  # the 2 free GPUs are its
        return
    assert r.returncode == 0, r.stderr
    r = cli("run", "-g", "1", "--wait", "--timeout", "10s", "--", "true", timeout=60)
    assert r.returncode == 0, r.stderr


# --- junk -------------------------------------------------------------------------------------


def test_junk_is_ruled_out_by_name_and_the_work_is_bounded(users, shared, monkeypatch) -> None:
    """20,000 junk files: names that are not ours cost a string test; files named like
    records are read up to a bound, then reported."""
    mallory, _ = users
    for i in range(10_000):
        (shared / f"junk-{i}").touch()
    for i in range(9_000):
        p = shared / f"GPU-{i:08x}-0000-0000-0000-000000000000.j{i}.lease"
        p.touch()
        os.chown(p, mallory, mallory)
    for i in range(1_000):
        (shared / f"{i:020d}-{i:08d}.1.wait.junk").touch()
    opened: list[str] = []
    real = lease.open_regular

    def counting(path, *a, **kw):  # type: ignore[no-untyped-def]
        opened.append(str(path))
        return real(path, *a, **kw)

    monkeypatch.setattr(lease, "open_regular", counting)
    snap = idle_a100s(2)
    started = time.monotonic()
    assert lease.list_leases() == []
    held = take(snap, count=1)
    held.release()
    elapsed = time.monotonic() - started
    assert not any(os.path.basename(p).startswith("junk-") for p in opened)
    assert not any(p.endswith(".junk") for p in opened)
    # At most MAX_RECORDS each: listing, listing to allocate, and (as root) tidying
    # the unheld ones read; 9,000 of each without the bound.
    assert len(opened) <= 3 * lease.MAX_RECORDS + 20
    assert elapsed < 20, elapsed  # was ~0.25 s per listing per 20,000 files before


# --- disk full, leftovers, clocks ----------------------------------------------------------


@pytest.fixture
def full_disk(shared: Path) -> Iterator[Path]:
    with small_disk(shared, "64k", mode="1777") as where:
        yield where


def _locked_anywhere(d: Path) -> list[str]:
    held = []
    for name in os.listdir(d):
        if name.endswith(".lock"):
            fd = os.open(d / name, os.O_RDONLY)
            if lease.is_locked(fd):
                held.append(name)
            os.close(fd)
    return held


def test_disk_full_fails_in_one_line_and_leaves_nothing(sim, cli, full_disk, tmp_path) -> None:
    sim("server-8xa100")
    uuids = sim_uuids()
    for u in [*uuids, "alloc"]:  # the permanent lock files exist on a machine in use
        (full_disk / f"{u}.lock").touch()
    fill(full_disk)
    before = set(os.listdir(full_disk))
    marker = tmp_path / "started"
    r = cli("run", "-g", "1", "--", "touch", str(marker))
    assert "No space left" in one_line_error(r)
    assert not marker.exists()  # the job never started without its lease record
    r = cli("reserve", "-g", "1")
    assert "No space left" in one_line_error(r)
    assert set(os.listdir(full_disk)) == before  # no record, no temporary file
    assert _locked_anywhere(full_disk) == []  # no holder left behind
    assert cli("status").returncode == 0


def test_disk_full_while_joining_the_line(sim, cli, full_disk) -> None:
    sim("server-8xa100")
    r = cli("reserve", "-g", "2")  # every GPU free on this machine (others are busy)
    assert r.returncode == 0, r.stderr
    try:
        fill(full_disk)
        before = set(os.listdir(full_disk))
        r = cli("run", "-g", "1", "--wait", "--timeout", "5s", "--", "true")
        assert "cannot join the line" in one_line_error(r)
        assert set(os.listdir(full_disk)) == before
    finally:
        os.unlink(full_disk / "filler")
        cli("release")


def test_temporary_files_of_killed_writers_are_swept(shared, procs) -> None:
    snap = idle_a100s(1)
    old = shared / f".{UUID0}.x.lease.99-0000.tmp"
    fresh = shared / f".{UUID0}.y.lease.99-0001.tmp"
    busy = shared / f".{UUID0}.z.lease.99-0002.tmp"
    for p in (old, fresh, busy):
        p.write_text("{")
    hour_ago = time.time() - 3600
    os.utime(old, (hour_ago, hour_ago))
    os.utime(busy, (hour_ago, hour_ago))
    as_user(os.geteuid(), procs, busy, fcntl.LOCK_EX)  # a writer still alive (stopped)
    take(snap, count=1).release()
    assert not old.exists()
    assert fresh.exists() and busy.exists()


def test_a_reservation_does_not_follow_the_wall_clock(sim, tmp_path) -> None:
    """The holder sees the wall clock 30 s behind (as after a step back): `--for 2s`
    still ends after about 2 s."""
    sim("server-8xa100")
    code = (
        "import os, runpy, sys, time\n"
        "real, me = time.time, os.getpid()\n"
        "time.time = lambda: real() - (30 if os.getpid() != me else 0)\n"
        "sys.argv = ['gpuwarden', 'reserve', '-g', '1', '--for', '2s']\n"
        "runpy.run_module('gpuwarden', run_name='__main__')\n"
    )
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).parent.parent / "src"))
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert len(lease.list_leases()) == 1
    # 15 s: it would be 32 s following the wall clock
    wait_for(lambda: not lease.list_leases(), 15, "the reservation's end after --for 2s")


def test_hold_for_is_timed_by_the_boot_clock(monkeypatch) -> None:
    from gpuwarden.jobs import holder

    now = [100.0]
    monkeypatch.setattr(holder, "boottime", lambda: now[0])
    monkeypatch.setattr(time, "time", lambda: 0.0)  # whatever the wall clock says
    slept: list[float] = []

    def sleep(s: float) -> None:
        slept.append(s)
        now[0] += s

    holder.hold_for(5.0, sleep=sleep)
    assert sum(slept) == pytest.approx(5.0)


# --- what doctor says -----------------------------------------------------------------------


@pytest.mark.parametrize("shared", [True, False])
def test_doctor_says_a_shared_directory_cannot_be_made_fully_safe(shared: bool) -> None:
    from gpuwarden.doctor.checks import run_checks
    from gpuwarden.doctor.facts import Facts, TorchBuild

    found = run_checks(
        Facts(
            snapshot=idle_a100s(1),
            environ={},
            torch=TorchBuild(installed=False, skipped="no torch"),
            user="bob",
            lease_dir="/var/lib/gpuwarden/leases",
            lease_dir_shared=shared,
        )
    )
    trust = [f for f in found if f.check == "machine.lease-trust"]
    if not shared:
        assert trust == []
        return
    [finding] = trust
    assert finding.level == "INFO"
    assert "never be made fully safe" in finding.title and "gpuwarden serve" in finding.fix


def test_reserve_for_too_long_is_refused_and_a_far_end_shows_its_date(sim, cli) -> None:
    sim("server-8xa100")
    r = cli("reserve", "-g", "1", "--for", "99999999999d")
    assert "above ten years" in one_line_error(r)
    assert lease.list_leases() == []
    r = cli("reserve", "-g", "1", "--for", "3d")
    assert r.returncode == 0, r.stderr
    try:
        end = time.strftime("%Y-%m-%d", time.localtime(time.time() + 3 * 86400))
        assert f"until {end} " in r.stderr
    finally:
        assert cli("release").returncode == 0


def test_a_job_whose_lease_cannot_be_published_is_stopped(sim, monkeypatch, capsys) -> None:
    """If the record cannot be put in place after the job started, the job must not
    run on under a lease nobody sees: it is killed (and reaped) before run returns."""
    sim("server-8xa100")
    from gpuwarden.cli import main

    def fail(self: lease.Held, *args: object, **kw: object) -> None:
        self.drop_allocation_lock()
        raise UserError("cannot publish the lease record: No space left on device")

    monkeypatch.setattr(lease.Held, "publish", fail)
    with contextlib.suppress(ChildProcessError):
        while os.waitpid(-1, os.WNOHANG)[0]:  # reap any leftovers of earlier tests
            pass
    code = main(["run", "-g", "1", "--", "sleep", "60"])
    assert code != 0
    assert "No space left" in capsys.readouterr().err
    with pytest.raises(ChildProcessError):  # no child left running (or unreaped)
        os.waitpid(-1, os.WNOHANG)
    assert lease.list_leases() == []


def test_a_gpu_promised_to_a_waiter_is_not_called_a_lease() -> None:
    """The GPU the first waiter would get is not leased yet: the message says so
    instead of naming a lease that does not exist."""
    from gpuwarden.leases import waitline

    snap = idle_a100s(1)
    ticket = waitline.join(leasedir.open_dir(), Request(count=1))
    try:
        with pytest.raises(UserError) as err:
            take(snap, count=1)
        assert "(waiting in line)" in str(err.value), str(err.value)
    finally:
        ticket.leave()


def test_a_waiter_for_more_gpus_than_exist_does_not_make_the_line_hopeless(
    users, shared, procs
) -> None:
    """A waiter ahead counts its GPUs from its ticket's name; one asking for more than
    the machine has can never be served, so it must not make everyone behind it give
    up looking."""
    from gpuwarden.leases import waitline

    mallory, _ = users
    _ticket(shared, mallory, procs, CRAFTED["more GPUs than exist"])
    mine = waitline.join(leasedir.open_dir(), Request(count=1))
    try:
        position, _, ahead_need = mine.scan(check_alive=True, most=8)
        assert ahead_need == 0 and position == 1
    finally:
        mine.leave()


def test_warnings_about_junk_are_bounded(shared, monkeypatch, capsys) -> None:
    monkeypatch.setattr(lease, "_warned", set())
    for i in range(100):
        os.mkfifo(shared / f"GPU-{i:08x}-0000-0000-0000-000000000000.j.lease")
    lease.list_leases()
    lease.list_leases()
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == lease.MAX_WARNINGS + 1
    assert "not reporting them" in lines[-1]


def test_lock_files_precreated_by_root_cannot_be_recycled(users, procs, monkeypatch) -> None:
    """The README's set-up makes every lock file root's (`install -m 0644 /dev/null`):
    a user can no longer delete one held by another's job so that the next job locks a
    fresh file beside it (two jobs on one GPU), and every user still takes leases."""
    mallory, alice = users
    top = Path(tempfile.mkdtemp(prefix="gw-precreated-"))
    try:
        top.chmod(0o755)
        shared = top / "leases"
        shared.mkdir()
        shared.chmod(0o1777)
        names = [f"{UUID0}.lock", lease.ALLOC]
        for name in names:  # as the README's recipe does
            subprocess.run(["install", "-m", "0644", "/dev/null", str(shared / name)], check=True)
        inodes = {n: (shared / n).stat().st_ino for n in names}
        gone = subprocess.run(
            ["runuser", "-u", pwd.getpwuid(mallory).pw_name, "--", "rm", "-f"]
            + [str(shared / n) for n in names],
            capture_output=True,
            text=True,
        )
        assert gone.returncode != 0 and "Operation not permitted" in gone.stderr
        assert {n: (shared / n).stat().st_ino for n in names} == inodes
        monkeypatch.setenv("GPUWARDEN_LEASE_DIR", str(shared))
        (top / "state").mkdir()
        (top / "state").chmod(0o1777)
        monkeypatch.setenv("GPUWARDEN_STATE_DIR", str(top / "state"))
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the child, as alice
            try:
                os.setgroups([])
                os.setgid(alice)
                os.setuid(alice)
                held = take(idle_a100s(1))
                os.write(w, b"ok" if held.gpus[0].uuid == UUID0 else b"no")
            except BaseException as err:
                os.write(w, repr(err).encode()[:500])
            finally:
                os._exit(0)
        os.close(w)
        procs.append(pid)
        assert os.read(r, 500) == b"ok"
        os.close(r)
        assert (shared / f"{UUID0}.lock").stat().st_uid == 0  # alice used root's file
    finally:
        shutil.rmtree(top, ignore_errors=True)
