"""Jobs run as their owner: uid, gid, supplementary groups, umask, cwd, environment,
output opened as the owner, and an exit status that survives the service."""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import signal
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuwarden.base.errors import UserError
from gpuwarden.service import becoming, exitrecord, spawn
from gpuwarden.service.identity import Admins, person
from users import make_user
from waiting import wait_for

# The test users cannot enter /root, where the venv's interpreter may live.
PY = shutil.which("python3", path="/usr/bin:/bin") or sys.executable


def wait_exit(status_dir: Path, job: str, timeout: float = 30.0) -> exitrecord.Ended:
    return wait_for(
        lambda: exitrecord.read_exit_record(str(status_dir), job), timeout, f"job {job}'s end", 0.01
    )


@pytest.fixture
def status_dir(tmp_path: Path) -> Path:
    d = tmp_path / "status"
    d.mkdir(mode=0o700)
    return d


@pytest.fixture
def open_tmp() -> Iterator[Path]:
    """A directory test users can reach (pytest's own tmp_path is private to root)."""
    d = Path(tempfile.mkdtemp(prefix="gw-test-"))
    d.chmod(0o755)
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def home(open_tmp: Path) -> Path:
    """A working directory every test user may enter and write."""
    d = open_tmp / "work"
    d.mkdir()
    d.chmod(0o1777)
    return d


def launch(owner, status_dir: Path, cwd: Path, argv, **kw) -> spawn.JobStart:  # type: ignore[no-untyped-def]
    kw.setdefault("env", {"PATH": os.environ["PATH"]})
    return spawn.JobStart(
        job=kw.pop("job", "j1"),
        argv=tuple(argv),
        owner=owner,
        cwd=str(cwd),
        status_dir=str(status_dir),
        **kw,
    )


PROBE = (
    "import os, json; print(json.dumps({'uid': os.getuid(), 'euid': os.geteuid(), "
    "'gid': os.getgid(), 'groups': sorted(os.getgroups()), 'cwd': os.getcwd(), "
    "'umask': os.umask(0), 'env': dict(os.environ)}))"
)


def test_a_job_runs_as_its_owner_with_every_group(status_dir: Path, home: Path) -> None:
    alice = make_user("alice", groups=("lab", "cluster"))
    out = home / "alice.out"
    env = {
        "PATH": os.environ["PATH"],
        "USER": "root",  # what the client claims is never used for identity
        "CUDA_VISIBLE_DEVICES": "0,1,2,3",  # the service controls these
        "GPUWARDEN_LEASE_DIR": "/tmp/x",
        "KEEP": "yes",
    }
    started = spawn.start(
        launch(
            alice,
            status_dir,
            home,
            [PY, "-c", PROBE],
            env=env,
            umask=0o027,
            output=str(out),
            extra_env={"CUDA_VISIBLE_DEVICES": "GPU-x"},
        )
    )
    assert started.pid > 0 and started.supervisor > 0
    ended = wait_exit(status_dir, "j1")
    assert ended.ok, out.read_text()
    seen = json.loads(out.read_text())
    assert seen["uid"] == seen["euid"] == alice.uid
    assert seen["gid"] == alice.gid
    assert set(seen["groups"]) == set(alice.groups)
    assert len(alice.groups) >= 3  # primary + lab + cluster: initgroups, not setuid alone
    assert 0 not in seen["groups"]
    assert seen["cwd"] == str(home)
    assert seen["umask"] == 0o027
    assert seen["env"]["CUDA_VISIBLE_DEVICES"] == "GPU-x"
    assert "GPUWARDEN_LEASE_DIR" not in seen["env"] and seen["env"]["KEEP"] == "yes"
    assert out.stat().st_uid == alice.uid  # created by the job, as alice
    spawn.wait_supervisor(started.supervisor, timeout=10)


def test_output_is_opened_as_the_owner_so_a_planted_symlink_cannot_redirect_it(
    status_dir: Path, home: Path, open_tmp: Path
) -> None:
    bob = make_user("bob")
    secret = open_tmp / "root-only"
    secret.write_text("untouched\n")
    secret.chmod(0o600)
    link = home / "bob.out"
    link.symlink_to(secret)
    with pytest.raises(UserError, match=r"cannot open output .*Permission denied"):
        spawn.start(launch(bob, status_dir, home, ["true"], output=str(link)))
    assert secret.read_text() == "untouched\n"
    ended = wait_exit(status_dir, "j1")
    assert ended.error and "Permission denied" in ended.error and ended.shell_status == 127


def test_a_directory_the_owner_cannot_enter_is_refused(status_dir: Path, open_tmp: Path) -> None:
    bob = make_user("bob")
    private = open_tmp / "private"
    private.mkdir(mode=0o700)
    with pytest.raises(UserError, match="cannot enter"):
        spawn.start(launch(bob, status_dir, private, ["true"]))


def test_a_missing_program_is_one_line(status_dir: Path, home: Path) -> None:
    bob = make_user("bob")
    with pytest.raises(UserError, match="cannot run 'no-such-program-here'"):
        spawn.start(launch(bob, status_dir, home, ["no-such-program-here"]))


def test_exit_codes_and_signals_are_recorded(status_dir: Path, home: Path) -> None:
    bob = make_user("bob")
    spawn.start(launch(bob, status_dir, home, ["sh", "-c", "exit 3"], job="code"))
    assert wait_exit(status_dir, "code").shell_status == 3
    started = spawn.start(launch(bob, status_dir, home, ["sleep", "60"], job="sig"))
    assert spawn.signal_job(started.pid, signal.SIGTERM)
    ended = wait_exit(status_dir, "sig")
    assert ended.signal == signal.SIGTERM and ended.shell_status == 128 + signal.SIGTERM


def test_the_job_outlives_a_dead_supervisor_parent(status_dir: Path, home: Path) -> None:
    """The supervisor is in its own session: the service's death (here: not waiting
    for it at all) leaves the job running, and the exit record still appears."""
    bob = make_user("bob")
    started = spawn.start(launch(bob, status_dir, home, ["sh", "-c", "sleep 0.3; exit 4"]))
    assert os.getsid(started.supervisor) == started.supervisor
    assert os.getpgid(started.pid) == started.pid
    assert wait_exit(status_dir, "j1").code == 4


def test_the_supervisor_holds_the_lease_descriptors_and_the_job_never_has_them(
    status_dir: Path, home: Path, tmp_path: Path
) -> None:
    """The lease lock stays taken while the job runs (its supervisor holds it), yet the
    job has no descriptor of it to pass out, and it is free once the job has ended."""
    bob = make_user("bob")
    lock = tmp_path / "lease"
    lock.write_text("")
    fd = os.open(lock, os.O_RDONLY | os.O_CLOEXEC)
    fcntl.flock(fd, fcntl.LOCK_EX)
    out, go = home / "fds.out", home / "go"
    script = (
        "import os, time\n"
        "print(sorted(os.readlink(f'/proc/self/fd/{n}') for n in os.listdir('/proc/self/fd')"
        " if os.path.exists(f'/proc/self/fd/{n}')), flush=True)\n"
        f"while not os.path.exists({str(go)!r}): time.sleep(0.01)\n"
    )
    spawn.start(launch(bob, status_dir, home, [PY, "-c", script], keep=(fd,), output=str(out)))
    os.close(fd)  # ours: only the supervisor's copy holds the lock now
    wait_for(out.read_text, 30, "the job's list of its descriptors")
    assert str(lock) not in out.read_text()
    probe = os.open(lock, os.O_RDONLY)
    try:
        with pytest.raises(BlockingIOError):
            fcntl.flock(probe, fcntl.LOCK_EX | fcntl.LOCK_NB)
        go.touch()
        assert wait_exit(status_dir, "j1").ok, out.read_text()

        def unlocked() -> bool:
            try:
                fcntl.flock(probe, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return False
            return True

        # the supervisor exits just after the record
        wait_for(unlocked, 30, "the lease's end after its job", 0.01)
    finally:
        os.close(probe)


def test_environment_filter() -> None:
    env = becoming.job_environment(
        {"A": "1", "CUDA_DEVICE_ORDER": "FASTEST_FIRST", "GPUWARDEN_X": "y"},
        {"CUDA_DEVICE_ORDER": "PCI_BUS_ID"},
    )
    assert env == {"A": "1", "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}


@pytest.mark.parametrize("ranges", [True, False], ids=["close_range", "listed"])
def test_a_supervisor_keeps_only_the_descriptors_it_names(
    ranges: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`close_all_but` by close_range(2) over the gaps between the kept descriptors, and
    by /proc/self/fd's listing where the kernel has no close_range: the same descriptors
    are left either way, those above the highest kept one and between kept ones gone."""
    if not ranges:
        monkeypatch.setattr(becoming.tree, "close_ranges", lambda keep: False)
    read, write = os.pipe()
    opened = [os.open(os.devnull, os.O_RDONLY) for _ in range(6)]
    high = os.dup2(opened[0], 300, inheritable=False)  # far above the rest
    keep = {write, opened[2], opened[4]}
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            becoming.close_all_but({0, 1, 2, *keep})
            left = [fd for fd in (0, 1, 2, read, high, *keep, *opened) if _open(fd)]
            os.write(write, json.dumps(left).encode())
            code = 0
        finally:
            os._exit(code)
    os.close(write)
    try:
        left = set(json.loads(os.read(read, 65536)))
        os.waitpid(pid, 0)
    finally:
        for fd in (read, high, *opened):
            os.close(fd)
    assert left == {0, 1, 2, *keep}, left


def _open(fd: int) -> bool:
    try:
        fcntl.fcntl(fd, fcntl.F_GETFD)
    except OSError:
        return False
    return True


@pytest.mark.parametrize("bad", [[], "ls", [""], ["ls", 3], ["a\0b"], None])
def test_malformed_commands(bad: object) -> None:
    with pytest.raises(UserError):
        spawn.argv_of(bad)


def test_admins_by_name_group_and_root() -> None:
    root = person(0)
    alice = make_user("alice", groups=("lab",))
    bob = make_user("bob")
    admins = Admins.parse(["gw-bob"])
    assert admins.include(root) and admins.include(bob) and not admins.include(alice)
    assert Admins.parse(["@gw-lab"]).include(alice)
    with pytest.raises(UserError, match="no group named"):
        Admins.parse(["@no-such-group-here"])
