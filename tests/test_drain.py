"""Drains: persistence, atomicity, who may undrain, and the drain/undrain/select commands."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuwarden.base.errors import UserError
from gpuwarden.files.paths import check_dir, ensure_dir
from gpuwarden.health import drain as drains
from hermetic import hermetic

SRC = Path(__file__).resolve().parent.parent / "src"
NOBODY = 65534


def test_drain_persists_with_who_when_why(isolated: Path) -> None:
    record = drains.drain("GPU-aaaa", "  XID 79 fell off the bus ")
    assert record.reason == "XID 79 fell off the bus"
    assert not record.auto and record.uid == os.getuid()
    listed = drains.list_drains()
    assert list(listed) == ["GPU-aaaa"]
    assert listed["GPU-aaaa"].reason == "XID 79 fell off the bus"
    assert listed["GPU-aaaa"].by == record.by
    assert abs(listed["GPU-aaaa"].at - record.at) < 1e-3
    path = isolated / "state" / "drain.GPU-aaaa.json"
    assert json.loads(path.read_text())["reason"] == "XID 79 fell off the bus"
    assert stat.S_IMODE(os.stat(isolated / "state").st_mode) == 0o700
    drains.drain("GPU-aaaa", "ECC", by="gpuwarden-health", auto=True)  # same owner: updates
    assert drains.list_drains()["GPU-aaaa"].auto is True
    drains.undrain("GPU-aaaa")
    assert drains.list_drains() == {}
    assert not [p for p in (isolated / "state").iterdir() if p.name.endswith(".tmp")]


def test_missing_state_dir_means_no_drains(isolated: Path) -> None:
    assert drains.list_drains(isolated / "nowhere") == {}


def test_bad_requests() -> None:
    with pytest.raises(UserError, match="needs a reason"):
        drains.drain("GPU-a", " ")
    with pytest.raises(UserError, match="GPU-a is not drained"):
        drains.undrain("GPU-a")
    with pytest.raises(UserError, match="invalid GPU UUID"):
        drains.drain("../etc", "x")


def test_a_corrupt_record_still_drains(isolated: Path) -> None:
    state = isolated / "state"
    state.mkdir()
    (state / "drain.GPU-bad.json").write_text("{not json")
    record = drains.list_drains()["GPU-bad"]
    assert record.reason.startswith("unreadable drain record")


def test_concurrent_drains_lose_nothing(isolated: Path) -> None:
    errors: list[BaseException] = []

    def work(i: int) -> None:
        try:
            for j in range(10):
                drains.drain(f"GPU-{i}", f"reason {j}")
        except BaseException as err:  # pragma: no cover - reported below
            errors.append(err)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert {u: d.reason for u, d in drains.list_drains().items()} == {
        f"GPU-{i}": "reason 9" for i in range(6)
    }


def test_unsafe_state_directories_are_refused(isolated: Path) -> None:
    real = ensure_dir(isolated / "real")
    link = isolated / "link"
    link.symlink_to(real)
    with pytest.raises(UserError, match=f"refusing state directory {link}: it is a symlink"):
        drains.drain("GPU-a", "x", directory=link)
    open_dir = isolated / "open"
    open_dir.mkdir()
    open_dir.chmod(0o777)
    with pytest.raises(UserError, match="writable by others without the sticky bit"):
        check_dir(open_dir)
    open_dir.chmod(0o1777)
    assert check_dir(open_dir) == open_dir


# --- several users: needs root to act as another one ------------------------------------------


def _python_for(uid: int) -> str | None:
    for exe in (sys.executable, "/usr/bin/python3"):
        try:
            probe = subprocess.run(
                [
                    exe,
                    "-c",
                    "import sys; sys.path.insert(0, sys.argv[1]); import gpuwarden.health.drain",
                    str(SRC),
                ],
                user=uid,
                capture_output=True,
                env={**hermetic(), "PATH": "/usr/bin:/bin"},
            )
        except OSError:
            continue
        if probe.returncode == 0:
            return exe
    return None


@pytest.fixture
def shared_dir() -> Iterator[Path]:
    if os.getuid() != 0:
        pytest.skip("acting as another user needs root")
    where = Path(tempfile.mkdtemp(prefix="gw-shared-", dir="/tmp"))
    where.chmod(0o1777)  # as an admin would create /var/lib/gpuwarden/state
    yield where
    shutil.rmtree(where, ignore_errors=True)


def _as_nobody(
    exe: str, where: Path, call: str, system: str = "/nonexistent"
) -> subprocess.CompletedProcess[str]:
    code = (
        "import sys; sys.path.insert(0, sys.argv[1]); from gpuwarden.health import drain; "
        "from gpuwarden.base.errors import UserError; from gpuwarden.config import load\n"
        f"try:\n    {call}\nexcept UserError as e:\n    print(e); sys.exit(2)"
    )
    env = {**hermetic(), "PATH": "/usr/bin:/bin", "GPUWARDEN_STATE_DIR": str(where), "HOME": "/"}
    return subprocess.run(
        [exe, "-c", code, str(SRC)],
        user=NOBODY,
        capture_output=True,
        text=True,
        env={**env, "GPUWARDEN_SYSTEM_CONFIG": system},
    )


# What `gpuwarden drain` hands the drain functions: the admins of its reading.
ADMINS = "load().get('service.admins')"


def test_only_root_and_admins_drain_in_a_shared_dir_and_undrain_their_own(
    shared_dir: Path,
) -> None:
    exe = _python_for(NOBODY)
    if exe is None:
        pytest.skip("no Python the unprivileged user can run")
    mine = drains.drain("GPU-root", "bad fan", directory=shared_dir)
    assert mine.uid == 0
    # An ordinary user of the shared directory may not take a GPU from everyone.
    for call in ("drain.undrain('GPU-root')", "drain.drain('GPU-theirs', 'testing')"):
        out = _as_nobody(exe, shared_dir, call)
        assert out.returncode == 2, out.stderr
        assert out.stdout.strip() == (
            "only root or an admin (service.admins) may drain or undrain GPUs in the shared "
            f"directory {shared_dir}"
        )
    # An admin may (the caller hands down `service.admins` of its reading, as `gpuwarden
    # drain` does), and lifts only their own drains (and root, anyone's).
    system = shared_dir.parent / f"{shared_dir.name}-config" / "system.toml"
    system.parent.mkdir(mode=0o755)  # root's, readable by the user (tmp_path is not)
    system.write_text('[service]\nadmins = ["nobody"]\n')
    system.chmod(0o644)
    out = _as_nobody(exe, shared_dir, f"drain.undrain('GPU-root', admins={ADMINS})", str(system))
    assert out.returncode == 2, out.stderr
    assert "only root or root may undrain it" in out.stdout
    out = _as_nobody(
        exe, shared_dir, f"drain.drain('GPU-root', 'mine now', admins={ADMINS})", str(system)
    )
    assert out.returncode == 2 and "already drained by root" in out.stdout
    out = _as_nobody(
        exe, shared_dir, f"drain.drain('GPU-theirs', 'testing', admins={ADMINS})", str(system)
    )
    assert out.returncode == 0, out.stdout + out.stderr
    theirs = drains.list_drains(shared_dir)["GPU-theirs"]
    assert theirs.uid == NOBODY
    out = _as_nobody(exe, shared_dir, f"drain.undrain('GPU-theirs', admins={ADMINS})", str(system))
    assert out.returncode == 0, out.stdout + out.stderr
    out = _as_nobody(
        exe, shared_dir, f"drain.drain('GPU-theirs', 'again', admins={ADMINS})", str(system)
    )
    drains.undrain("GPU-theirs", directory=shared_dir)  # root may
    assert set(drains.list_drains(shared_dir)) == {"GPU-root"}
    shutil.rmtree(system.parent)


# --- commands on the simulated machine ---------------------------------------------------------


def test_cli_drain_undrain_and_select_on_the_simulated_server(sim, cli) -> None:
    sim("server-8xa100")
    from gpuwarden.machine.inventory import read_snapshot

    uuids = [g.uuid for g in read_snapshot(processes=False).gpus]
    out = cli("drain", "3", uuids[5][:10], "--reason", "XID 79 on the bus")
    assert out.returncode == 0, out.stderr
    assert f"drained GPU 3 ({uuids[3]}): XID 79 on the bus" in out.stdout
    assert set(drains.list_drains()) == {uuids[3], uuids[5]}
    listing = cli("drain").stdout
    assert f"{uuids[3]}: drained by " in listing and "XID 79 on the bus" in listing
    out = cli("select", "-n", "1", "--min-free", "1GiB", "--explain")
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() not in ("3", "5")
    assert f"GPU 3 {uuids[3]}: drained by" in out.stderr
    assert "not reserved" in out.stderr
    out = cli("select", "-n", "8")
    assert out.returncode == 2
    assert "asked for 8 GPUs but only" in out.stderr and "drained by" in out.stderr
    out = cli("undrain", "3,5")
    assert out.returncode == 0, out.stderr
    assert drains.list_drains() == {}


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("select", "--min-free", "10XB"), "gpuwarden select: invalid min_free '10XB'"),
        (
            ("select", "--gpus", "12"),
            "gpuwarden select: unknown GPU '12': this machine has GPUs 0-7",
        ),
        (
            ("select", "-n", "two"),
            "gpuwarden select: invalid GPU count 'two': expected a whole number, 0 or more",
        ),
        (("select", "-n", "9"), "asked for 9 GPUs but this machine has only 8 GPUs"),
        (("select", "--min-free", "1TiB"), "none is suitable for this request"),
        (("drain", "12", "--reason", "x"), "gpuwarden drain: unknown GPU '12'"),
        (("drain", "1"), "gpuwarden drain: a drain needs a reason"),
        (("undrain", "1"), "is not drained"),
        (("undrain",), "name the GPUs to undrain"),
    ],
)
def test_cli_bad_inputs_are_one_line(sim, cli, args: tuple[str, ...], message: str) -> None:
    sim("server-8xa100")
    out = cli(*args)
    assert out.returncode == 2, out
    assert message in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1
    assert out.stdout == ""


def test_cli_ambiguous_uuid_prefix(sim, cli) -> None:
    from gpuwarden.machine.inventory import read_snapshot

    sim("server-8xa100")
    uuids = [g.uuid for g in read_snapshot(processes=False).gpus]
    out = cli("select", "--gpus", "GPU-")
    assert out.returncode == 2
    assert "GPU ID 'GPU-' is ambiguous: it matches GPU 0" in out.stderr
    assert uuids[0] in out.stderr


def test_cli_select_prints_ids_for_scripts(sim, cli) -> None:
    sim("server-8xa100")
    out = cli("select", "-n", "2", "--min-free", "1GiB", "-q")
    assert out.returncode == 0, out.stderr
    ids = out.stdout.strip().split(",")
    assert len(ids) == 2 and all(i.isdigit() for i in ids)
    assert out.stderr == ""
    out = cli("select", "-n", "1", "--min-free", "1GiB", "--uuid")
    assert out.stdout.startswith("GPU-")
    # Inside a parent restriction, only those GPUs are candidates.
    out = cli("select", "-n", "1", "--min-free", "1GiB", env={"CUDA_VISIBLE_DEVICES": "7"})
    assert out.stdout.strip() == "7", out.stderr
