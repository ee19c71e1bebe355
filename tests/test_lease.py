"""Leases on hand-built snapshots: taking, sharing, listing, tidying, the line."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import gpuwarden.leases as lease
from gpuwarden.base.errors import UserError
from gpuwarden.jobs import allocation
from gpuwarden.leases import dir as leasedir
from gpuwarden.leases import waitline
from gpuwarden.machine.inventory import Snapshot
from gpuwarden.placement.request import Request
from gpuwarden.placement.requestwire import to_wire
from machines import idle_a100s

GiB = 2**30


def take(snap: Snapshot, wait: bool = False, **req: object) -> lease.Held:
    held = allocation.acquire(Request(**req), snapshot=lambda: snap, wait=wait, timeout=None)
    held.publish(os.getpid(), "test job")
    return held


def test_exclusive_leases_never_share_a_gpu() -> None:
    snap = idle_a100s(2)
    a = take(snap, count=1)
    b = take(snap, count=1)
    assert {a.uuids[0], b.uuids[0]} == {g.uuid for g in snap.gpus}
    with pytest.raises(UserError) as err:
        take(snap, count=1)
    assert err.value.exit_code == lease.EXIT_BUSY
    assert "leased by" in str(err.value)
    a.release()
    c = take(snap, count=1)
    assert c.uuids == a.uuids
    b.release()
    c.release()
    assert lease.list_leases() == []


def test_metadata_is_listed_with_owner_from_the_kernel() -> None:
    snap = idle_a100s(1)
    held = take(snap, count=1)
    [info] = lease.list_leases()
    assert info.uuid == snap.gpus[0].uuid
    assert info.pid == os.getpid()
    assert info.command == "test job"
    assert info.job == held.job
    assert info.mem is None
    import pwd

    assert info.user == pwd.getpwuid(os.geteuid()).pw_name
    held.release()
    assert lease.list_leases() == []
    assert not [n for n in os.listdir(held.dir.path) if n.endswith(".lease")]


def test_shared_leases_stack_while_declared_memory_fits() -> None:
    snap = idle_a100s(1, total=40 * GiB)
    a = take(snap, count=1, mem=15 * GiB)
    b = take(snap, count=1, mem=15 * GiB)
    assert a.uuids == b.uuids
    with pytest.raises(UserError, match="no room"):
        take(snap, count=1, mem=15 * GiB)
    with pytest.raises(UserError, match="leased by"):
        take(snap, count=1)  # an exclusive lease never shares
    assert sorted(i.mem for i in lease.list_leases()) == [15 * GiB, 15 * GiB]
    a.release()
    b.release()
    ex = take(snap, count=1)
    with pytest.raises(UserError):
        take(snap, count=1, mem=1 * GiB)  # nor does a shared one join an exclusive
    ex.release()


def test_kernel_enforces_the_lock_even_without_metadata() -> None:
    """A GPU locked by something that left no metadata is not handed out twice."""
    snap = idle_a100s(2)
    ld = leasedir.open_dir()
    import fcntl

    fd = os.open(ld.join(snap.gpus[1].uuid + ".lock"), os.O_RDONLY | os.O_CREAT)
    fcntl.flock(fd, fcntl.LOCK_EX)
    try:
        a = take(snap, count=1, keep_first_last=False)
        assert a.uuids == (snap.gpus[0].uuid,)
        with pytest.raises(UserError):
            take(snap, count=1)
        a.release()
    finally:
        os.close(fd)


def test_stale_metadata_is_ignored_and_tidied() -> None:
    snap = idle_a100s(1)
    held = take(snap, count=1)
    final = held._final[0]
    held.close()  # as if the holder died: lock gone, file left behind
    assert os.path.exists(final)
    assert lease.list_leases() == []
    again = take(snap, count=1)  # the allocation pass tidies it
    assert not os.path.exists(final)
    again.release()


HOLD = """
import os, sys, time
sys.stdout.write("ready\\n"); sys.stdout.flush()
time.sleep(60)
"""


def test_lease_lives_in_the_child_and_dies_with_it() -> None:
    snap = idle_a100s(1)
    held = take(snap, count=1)
    child = subprocess.Popen(
        [sys.executable, "-c", HOLD], pass_fds=held.fds, stdout=subprocess.PIPE, text=True
    )
    assert child.stdout.readline() == "ready\n"
    held.close()  # the wrapper goes away; the job keeps the lease
    assert [i.uuid for i in lease.list_leases()] == [snap.gpus[0].uuid]
    with pytest.raises(UserError):
        take(snap, count=1)
    child.send_signal(signal.SIGKILL)
    child.wait()
    t0 = time.monotonic()
    again = take(snap, count=1)
    assert time.monotonic() - t0 < 1.0
    again.release()


def test_never_fits_fails_at_once_even_when_waiting() -> None:
    snap = idle_a100s(2)
    t0 = time.monotonic()
    with pytest.raises(UserError, match="only 2 GPUs") as err:
        take(snap, wait=True, count=3)
    assert err.value.exit_code == 2
    assert time.monotonic() - t0 < 1


def test_wait_times_out_with_busy_exit_code() -> None:
    snap = idle_a100s(1)
    held = take(snap, count=1)
    seen = []
    t0 = time.monotonic()
    with pytest.raises(UserError, match="timed out") as err:
        allocation.acquire(
            Request(count=1),
            snapshot=lambda: snap,
            wait=True,
            timeout=0.3,
            on_wait=lambda *a: seen.append(a),
        )
    assert err.value.exit_code == lease.EXIT_BUSY
    assert 0.3 <= time.monotonic() - t0 < 2
    assert seen and seen[0][0] == 1  # first in line
    assert not [n for n in os.listdir(held.dir.path) if n.endswith(".wait")]
    held.release()


def test_earlier_waiter_is_served_first() -> None:
    """Strict first come, first served: a waiter for 2 GPUs blocks a later one for 1."""
    snap = idle_a100s(2)
    held = take(snap, count=1)
    ld = leasedir.open_dir()
    ticket = waitline.join(ld, Request(count=2))
    try:
        with pytest.raises(UserError, match="waiting in line") as err:
            take(snap, count=1)
        assert err.value.exit_code == lease.EXIT_BUSY
        held.release()
        # Both free now: the earlier waiter's two GPUs are set aside for it.
        with pytest.raises(UserError):
            take(snap, count=1)
        line = waitline.read_line(ld)
        assert [w.key for w in line] == [ticket.key]
        assert line[0].request == Request(count=2)
    finally:
        ticket.leave()
    take(snap, count=1).release()


def test_a_ticket_keeps_the_request_as_the_queue_service_reads_it() -> None:
    """A ticket holds its request in the wire form (placement.requestwire, the one
    conversion each way), and the ranking the wire leaves to the service beside it:
    what the others read back is the request the waiter made."""
    ld = leasedir.open_dir()
    asked = Request(
        count=2,
        gpus=("0", "GPU-1"),
        min_free=0,  # `--min-free 0`: allowed, asks for nothing
        max_util=20.0,
        min_capability=(8, 0),
        model="A100",
        exclude=("3",),
        keep_first_last=False,
        mig=None,
    )
    ticket = waitline.join(ld, asked)
    try:
        (waiter,) = waitline.read_line(ld)
        assert waiter.request == asked
        with open(ticket.path, encoding="utf-8") as fh:
            written = json.load(fh)
        assert written["request"] == to_wire(asked) and written["keep_first_last"] is False
    finally:
        ticket.leave()


def test_dead_waiter_leaves_the_line() -> None:
    ld = leasedir.open_dir()
    code = (
        "import time; from gpuwarden.leases import waitline; "
        "from gpuwarden.leases import dir as leasedir; "
        "from gpuwarden.placement.request import Request; "
        "waitline.join(leasedir.open_dir(), Request(count=1)); print('in', flush=True); "
        "time.sleep(60)"
    )
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert child.stdout.readline() == "in\n"
    assert len(waitline.read_line(ld)) == 1
    child.kill()
    child.wait()
    assert waitline.read_line(ld, tidy=True) == []
    assert not [n for n in os.listdir(ld.path) if n.endswith(".wait")]


# --- safety of the lease directory -----------------------------------------------------------


def test_symlinked_lease_dir_is_refused(tmp_path: Path) -> None:
    real = tmp_path / "real"
    real.mkdir(mode=0o700)
    link = tmp_path / "link"
    link.symlink_to(real)
    with pytest.raises(UserError, match="symbolic link"):
        leasedir.open_dir(str(link))


def test_world_writable_dir_without_sticky_bit_is_refused(tmp_path: Path) -> None:
    d = tmp_path / "open"
    d.mkdir()
    d.chmod(0o777)
    with pytest.raises(UserError, match="sticky") as err:
        leasedir.open_dir(str(d))
    assert str(d) in str(err.value)
    d.chmod(0o1777)
    assert leasedir.open_dir(str(d)).shared


def test_symlinked_lock_file_is_refused() -> None:
    snap = idle_a100s(1)
    ld = leasedir.open_dir()
    os.symlink("/etc/passwd", ld.join(snap.gpus[0].uuid + ".lock"))
    with pytest.raises(UserError, match="symbolic link"):
        take(snap, count=1)


def test_missing_dir_is_created_private(tmp_path: Path) -> None:
    ld = leasedir.open_dir(str(tmp_path / "a" / "leases"))
    assert os.stat(ld.path).st_mode & 0o777 == 0o700
    assert not ld.shared


needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="changing owners needs root")


@needs_root
def test_dir_owned_by_another_user_is_refused(tmp_path: Path) -> None:
    d = tmp_path / "theirs"
    d.mkdir(mode=0o700)
    os.chown(d, 65534, 65534)
    with pytest.raises(UserError, match="owned by") as err:
        leasedir.open_dir(str(d))
    assert str(d) in str(err.value)


@needs_root
def test_foreign_lock_file_in_private_dir_is_refused() -> None:
    snap = idle_a100s(1)
    ld = leasedir.open_dir()
    path = ld.join(snap.gpus[0].uuid + ".lock")
    Path(path).touch()
    os.chown(path, 65534, 65534)
    with pytest.raises(UserError, match="owned by") as err:
        take(snap, count=1)
    assert path in str(err.value)


def test_lease_dir_on_nfs_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    mounts = tmp_path / "mounts"
    d = tmp_path / "home" / "leases"
    d.mkdir(parents=True, mode=0o700)
    mounts.write_text(
        f"/dev/sda1 / ext4 rw 0 0\nserver:/export/home {tmp_path / 'home'} nfs4 rw 0 0\n"
    )
    assert leasedir.filesystem_type(str(d), str(mounts)) == "nfs4"
    assert leasedir.filesystem_type("/etc", str(mounts)) == "ext4"
    real = leasedir.filesystem_type
    monkeypatch.setattr(leasedir, "filesystem_type", lambda p: real(p, str(mounts)))
    with pytest.raises(UserError, match="is on nfs4") as err:
        leasedir.open_dir(str(d))
    assert "local directory" in str(err.value)
