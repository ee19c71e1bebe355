"""`gpuwarden service install|uninstall|status`: every file, its mode and contents, and
that uninstall takes away exactly what install made (installed under a temporary root)."""

from __future__ import annotations

import configparser
import json
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

try:
    import tomllib
except ImportError:  # Python < 3.11
    import tomli as tomllib  # type: ignore[no-redef]

from components import require
from gpuwarden.base.errors import UserError
from gpuwarden.service import install, uninstall, unitfiles

ROOT = Path(__file__).resolve().parent.parent


def tree(root: Path) -> dict[str, tuple[str, int, str]]:
    """Every path under `root`: (kind, mode, sha of a file's bytes)."""
    import hashlib

    found = {}
    for path in sorted(root.rglob("*")):
        st = path.lstat()
        if stat.S_ISDIR(st.st_mode):
            found[str(path.relative_to(root))] = ("dir", stat.S_IMODE(st.st_mode), "")
        else:
            digest = hashlib.sha256(path.read_bytes()).hexdigest()
            found[str(path.relative_to(root))] = ("file", stat.S_IMODE(st.st_mode), digest)
    return found


def mode(path: Path) -> int:
    return stat.S_IMODE(path.lstat().st_mode)


def unit(path: Path) -> configparser.ConfigParser:
    parser = configparser.ConfigParser(interpolation=None, strict=True)
    parser.optionxform = str  # type: ignore[assignment,method-assign]  # keys are case-sensitive
    parser.read_string(path.read_text())
    return parser


def test_install_writes_every_file_with_its_mode_and_contents(tmp_path: Path, cli: Any) -> None:
    root = tmp_path / "root"
    out = cli("service", "install", "--root", str(root))
    assert out.returncode == 0, out.stderr
    assert "not started" in out.stdout
    service = unit(root / "etc/systemd/system/gpuwarden.service")
    assert service["Service"]["ExecStart"].endswith(" serve")
    assert os.path.isabs(service["Service"]["ExecStart"].split()[0])
    assert service["Service"]["User"] == "root"
    assert service["Service"]["KillMode"] == "process"  # jobs outlive a restart
    assert service["Service"]["ProtectSystem"] == "full"
    # Each of these would break jobs (the unit says why): none is set.
    off = ("ProtectHome", "PrivateTmp", "PrivateDevices", "NoNewPrivileges", "ProtectClock")
    off += ("DevicePolicy", "DeviceAllow", "ProtectKernelTunables", "ProtectControlGroups")
    assert not set(off) & set(service["Service"])
    assert service["Install"]["WantedBy"] == "multi-user.target"
    assert mode(root / "etc/systemd/system/gpuwarden.service") == 0o644

    tmpfiles = (root / "etc/tmpfiles.d/gpuwarden-service.conf").read_text()
    entries = {
        line.split()[1]: line.split()
        for line in tmpfiles.splitlines()
        if line.strip() and not line.startswith("#")
    }
    assert entries["/run/gpuwarden"][:5] == ["d", "/run/gpuwarden", "0755", "root", "root"]
    assert entries["/var/lib/gpuwarden/leases"][2] == "0755"  # not 1777 with a service
    assert entries["/var/lib/gpuwarden/state"][2] == "0755"
    assert entries["/var/lib/gpuwarden/service"][2] == "0700"

    for path, want in (
        ("run/gpuwarden", 0o755),
        ("var/lib/gpuwarden", 0o755),
        ("var/lib/gpuwarden/service", 0o700),
        ("var/lib/gpuwarden/leases", 0o755),
        ("var/lib/gpuwarden/state", 0o755),
    ):
        assert (root / path).is_dir() and mode(root / path) == want, path
        if os.geteuid() == 0:
            assert (root / path).stat().st_uid == 0

    config = root / "etc/gpuwarden/config.toml"
    assert tomllib.loads(config.read_text()) == {"service": {}}  # every key commented
    assert "# admins = " in config.read_text() and "# max_gpus_per_user" in config.read_text()

    manifest = json.loads((root / "var/lib/gpuwarden/service/install.json").read_text())
    assert set(manifest["files"]) == {
        "/etc/systemd/system/gpuwarden.service",
        "/etc/tmpfiles.d/gpuwarden-service.conf",
        "/etc/systemd/system/gpuwarden-exporter.service.d/gpuwarden-service.conf",
        "/etc/gpuwarden/config.toml",
    }
    dropin = unit(root / "etc/systemd/system/gpuwarden-exporter.service.d/gpuwarden-service.conf")
    assert dict(dropin["Service"]) == {"StateDirectoryMode": "0755"}  # not the exporter's 1777
    assert mode(root / "var/lib/gpuwarden/service/install.json") == 0o600


def test_the_unit_passes_systemd_analyze_verify(tmp_path: Path) -> None:
    require(shutil.which("systemd-analyze") is not None, "systemd-analyze is not installed")
    install.install(str(tmp_path), exec_start=f"{sys.executable} -m gpuwarden")
    path = tmp_path / "etc/systemd/system/gpuwarden.service"
    done = subprocess.run(
        ["systemd-analyze", "verify", str(path)], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert "gpuwarden.service" not in done.stderr, done.stderr  # no complaint about the unit


def test_the_service_tmpfiles_win_over_the_shared_directory_snippet(tmp_path: Path) -> None:
    """With the exporter's 1777 snippet installed too, systemd-tmpfiles gives the lease
    and state directories the service's 0755: its file name sorts first."""
    tmpfiles = shutil.which("systemd-tmpfiles")
    require(tmpfiles is not None, "systemd-tmpfiles is not installed (Debian package `systemd`)")
    install.install(str(tmp_path), exec_start="/usr/bin/gpuwarden")
    shared = tmp_path / "etc/tmpfiles.d/gpuwarden.conf"
    shutil.copy(ROOT / "deploy/gpuwarden.tmpfiles.conf", shared)
    for path in ("var/lib/gpuwarden/leases", "var/lib/gpuwarden/state"):
        (tmp_path / path).chmod(0o1777)  # as the snippet alone would have made them
    done = subprocess.run(
        [str(tmpfiles), "--create", f"--root={tmp_path}"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    for path in ("var/lib/gpuwarden/leases", "var/lib/gpuwarden/state"):
        assert mode(tmp_path / path) == 0o755, path
    assert mode(tmp_path / "var/lib/gpuwarden/service") == 0o700


def test_the_deploy_files_are_what_install_writes() -> None:
    shipped = (ROOT / "deploy/gpuwarden.service").read_text()
    assert shipped == unitfiles.unit_text("/usr/local/bin/gpuwarden")
    assert (ROOT / "deploy/gpuwarden.tmpfiles").read_text() == unitfiles.TMPFILES


def test_a_second_install_changes_nothing(tmp_path: Path) -> None:
    install.install(str(tmp_path), exec_start="/usr/bin/gpuwarden")
    before = tree(tmp_path)
    lines = install.install(str(tmp_path), exec_start="/usr/bin/gpuwarden")
    assert tree(tmp_path) == before
    assert all(line.startswith(("unchanged", "recorded")) for line in lines), lines


def test_uninstall_removes_what_install_made_and_keeps_the_journal(tmp_path: Path) -> None:
    (tmp_path / "etc/systemd/system").mkdir(parents=True)  # there before: stays
    before = tree(tmp_path)
    install.install(str(tmp_path), exec_start="/usr/bin/gpuwarden")
    journal = tmp_path / "var/lib/gpuwarden/service/jobs.db"
    journal.write_bytes(b"the service's journal")
    (tmp_path / "run/gpuwarden/gpuwarden.sock.lock").write_bytes(b"")  # a stopped service's
    lines = uninstall.uninstall(str(tmp_path))
    assert journal.read_bytes() == b"the service's journal"
    assert any("kept the job journal" in line for line in lines)
    left = tree(tmp_path)
    assert set(left) - set(before) == {
        "var",
        "var/lib",
        "var/lib/gpuwarden",
        "var/lib/gpuwarden/service",
        "var/lib/gpuwarden/service/jobs.db",
        "var/lib/gpuwarden/service/install.json",  # kept for a later --purge
        "run",  # parents above what install records: an empty skeleton under the prefix
        "etc/tmpfiles.d",
    }
    assert not (tmp_path / "etc/gpuwarden").exists()
    install.install(str(tmp_path), exec_start="/usr/bin/gpuwarden")
    with pytest.raises(UserError, match="cannot read the journal"):
        uninstall.uninstall(str(tmp_path), purge=True)  # not a journal: unknown jobs
    uninstall.uninstall(str(tmp_path), purge=True, force=True)
    assert not journal.exists() and not (tmp_path / "var/lib/gpuwarden/service").exists()
    assert not (tmp_path / "var/lib/gpuwarden/leases").exists()


def test_uninstall_keeps_its_record_until_purge_which_refuses_while_jobs_wait(
    tmp_path: Path,
) -> None:
    """The service's lock files go with the lease directory (unless a running job holds
    one); the install record stays, so that a later --purge finishes the job; --purge
    says what it removes, and refuses while jobs are queued unless forced."""
    import fcntl

    from gpuwarden.service import store

    install.install(str(tmp_path), exec_start="/usr/bin/gpuwarden")
    base = tmp_path / "var/lib/gpuwarden"
    for name in ("alloc.lock", "GPU-1.lock", "GPU-2.lock"):
        (base / "leases" / name).write_bytes(b"")
    (base / "state" / "drains.lock").write_bytes(b"")
    journal = store.Store(str(base / "service" / "jobs.db"))
    job = journal.add(
        store.new_job(
            uid=1000, gid=1000, user="ann", argv=["true"], cwd="/", env={}, umask=18, request={}
        )
    )
    journal.close()
    with open(base / "leases" / "GPU-2.lock") as held:
        fcntl.flock(held, fcntl.LOCK_EX)  # a job still running holds its lease
        lines = uninstall.uninstall(str(tmp_path))
    assert sorted(os.listdir(base / "leases")) == ["GPU-2.lock"], lines
    assert any("held by running jobs (GPU-2.lock)" in line for line in lines), lines
    assert (base / "service" / "install.json").exists()
    with pytest.raises(UserError, match=r"holds 1 queued or running job\(s\)"):
        uninstall.uninstall(str(tmp_path), purge=True)
    assert (base / "service" / "jobs.db").exists()  # nothing removed
    journal = store.Store(str(base / "service" / "jobs.db"))
    journal.update(job.id, state="CANCELLED")
    journal.close()
    lines = uninstall.uninstall(str(tmp_path), purge=True)
    assert any(line.startswith(f"removed {base / 'service'} (--purge): ") for line in lines)
    assert any("install.json" in line and "jobs.db" in line for line in lines), lines
    assert not base.exists(), lines


def test_an_admins_service_table_is_never_overwritten(tmp_path: Path) -> None:
    config = tmp_path / "etc/gpuwarden/config.toml"
    config.parent.mkdir(parents=True)
    mine = '[service]\nadmins = ["alice"]\n'
    config.write_text(mine)
    lines = install.install(str(tmp_path), exec_start="/usr/bin/gpuwarden")
    assert config.read_text() == mine
    assert any("already has a [service] table" in line for line in lines)
    uninstall.uninstall(str(tmp_path))
    assert config.read_text() == mine


def test_a_config_without_the_table_gets_it_appended_and_back(tmp_path: Path) -> None:
    config = tmp_path / "etc/gpuwarden/config.toml"
    config.parent.mkdir(parents=True)
    mine = '[lease]\ndir = "/srv/leases"'  # no newline at the end
    config.write_text(mine)
    config.chmod(0o640)
    install.install(str(tmp_path), exec_start="/usr/bin/gpuwarden")
    assert config.read_text().startswith(mine)
    assert tomllib.loads(config.read_text()) == {"lease": {"dir": "/srv/leases"}, "service": {}}
    install.install(str(tmp_path), exec_start="/usr/bin/gpuwarden")  # not appended twice
    assert config.read_text().count("[service]") == 1
    uninstall.uninstall(str(tmp_path))
    assert config.read_text() == mine and mode(config) == 0o640


def test_a_shared_lease_directory_is_closed_and_reopened(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("giving a file to another user needs root")
    leases = tmp_path / "var/lib/gpuwarden/leases"
    leases.mkdir(parents=True)
    leases.chmod(0o1777)
    left = leases / "GPU-0.lock"
    left.write_text("")
    os.chown(left, 4321, 4321)  # a user's lock file from the shared days
    lines = install.install(str(tmp_path), exec_start="/usr/bin/gpuwarden")
    assert mode(leases) == 0o755
    assert any("1777 -> 0755" in line for line in lines)
    assert any(line.startswith("note:") and "1 of 4321" in line for line in lines), lines
    left.unlink()
    install.install(str(tmp_path), exec_start="/usr/bin/gpuwarden")
    uninstall.uninstall(str(tmp_path))
    assert leases.is_dir() and mode(leases) == 0o1777  # as the admin had it


def test_files_install_did_not_write_are_left_alone(tmp_path: Path) -> None:
    path = tmp_path / "etc/systemd/system/gpuwarden.service"
    path.parent.mkdir(parents=True)
    path.write_text("[Service]\nExecStart=/opt/mine\n")
    lines = install.install(str(tmp_path), exec_start="/usr/bin/gpuwarden")
    assert path.read_text() == "[Service]\nExecStart=/opt/mine\n"
    assert any(line.startswith(f"left {path}") for line in lines)
    tmpfiles = tmp_path / "etc/tmpfiles.d/gpuwarden-service.conf"
    tmpfiles.write_text(tmpfiles.read_text() + "# an admin's line\n")
    lines = uninstall.uninstall(str(tmp_path))
    assert path.exists() and tmpfiles.exists()
    assert f"left {tmpfiles}: edited since install (--purge removes it)" in lines
    # --purge takes the file install wrote, edited or not; the admin's own stays.
    lines = uninstall.uninstall(str(tmp_path), purge=True)
    assert f"removed {tmpfiles} (--purge), edited since install" in lines
    assert path.exists() and not tmpfiles.exists()


@pytest.mark.parametrize(
    "setup, words",
    [
        ("symlink-config", "symbolic link"),
        ("fifo-unit", "FIFO"),
        ("file-for-dir", "is not a directory"),
        ("bad-manifest", "damaged"),
    ],
)
def test_bad_states_are_one_line(tmp_path: Path, cli: Any, setup: str, words: str) -> None:
    root = tmp_path / "root"
    if setup == "symlink-config":
        (root / "etc/gpuwarden").mkdir(parents=True)
        (root / "etc/gpuwarden/config.toml").symlink_to("/etc/passwd")
    elif setup == "fifo-unit":
        (root / "etc/systemd/system").mkdir(parents=True)
        os.mkfifo(root / "etc/systemd/system/gpuwarden.service")
    elif setup == "file-for-dir":
        (root / "var/lib/gpuwarden").mkdir(parents=True)
        (root / "var/lib/gpuwarden/leases").write_text("")
    else:
        (root / "var/lib/gpuwarden/service").mkdir(parents=True)
        (root / "var/lib/gpuwarden/service/install.json").write_text('{"version": 1, "files": 3}')
    out = cli("service", "install", "--root", str(root))
    assert out.returncode != 0 and "Traceback" not in out.stderr
    assert out.stderr.count("\n") == 1 and words in out.stderr, out.stderr
    assert not (root / "etc/systemd/system/gpuwarden.service").is_file()  # nothing half-done


def test_uninstall_refuses_while_the_service_answers_and_keeps_its_manifest(
    tmp_path: Path, cli: Any
) -> None:
    """Issue 23: uninstall went ahead under a running service (and dropped its manifest,
    so a second run said "nothing to remove")."""
    import socket
    import threading

    from gpuwarden.queueclient import protocol

    install.install(str(tmp_path), exec_start="/usr/bin/gpuwarden")
    where = str(tmp_path / "svc.sock")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(where)
    listener.listen(4)

    def answer() -> None:  # a service that answers hello
        conn, _ = listener.accept()
        with conn:
            conn.recv(65536)
            conn.sendall(protocol.encode({"v": protocol.VERSION, "ok": True, "version": 1}))

    threading.Thread(target=answer, daemon=True).start()
    out = cli("service", "uninstall", "--root", str(tmp_path), env={"GPUWARDEN_SOCKET": where})
    listener.close()
    assert out.returncode == 2 and out.stderr == (
        f"gpuwarden service: the service still answers at {where}: stop it first "
        "(`systemctl stop gpuwarden`, or end `gpuwarden serve`); nothing was removed\n"
    )
    assert (tmp_path / "var/lib/gpuwarden/service/install.json").exists()
    assert (tmp_path / "etc/systemd/system/gpuwarden.service").exists()
    os.unlink(where)
    gone = cli("service", "uninstall", "--root", str(tmp_path), env={"GPUWARDEN_SOCKET": where})
    assert gone.returncode == 0, gone.stderr
    assert not (tmp_path / "etc/systemd/system/gpuwarden.service").exists()


def test_uninstall_without_an_install_is_one_line(tmp_path: Path, cli: Any) -> None:
    out = cli("service", "uninstall", "--root", str(tmp_path))
    assert out.returncode != 0 and out.stderr.count("\n") == 1
    assert "nothing to remove" in out.stderr
    file = tmp_path / "plain"
    file.write_text("")
    out = cli("service", "install", "--root", str(file))
    assert out.returncode != 0 and "not a directory" in out.stderr


def test_without_systemd_install_says_how_to_start_by_hand(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from gpuwarden.cli import service as command

    calls: list[str] = []
    monkeypatch.setattr(install, "install", lambda root, **kw: calls.append(root) or [])
    monkeypatch.setattr(install, "systemd_running", lambda: False)
    monkeypatch.setattr(command, "_systemctl", lambda *a, **k: pytest.fail("systemctl ran"))
    args = type("Args", (), {"action": "install", "root": None, "no_start": False})()
    assert command.run(args) == 0  # type: ignore[arg-type]
    out = capsys.readouterr().out
    assert calls == ["/"] and "systemd is not running" in out and "gpuwarden serve" in out


def test_status_without_a_service(tmp_path: Path, cli: Any) -> None:
    sock = tmp_path / "none.sock"
    out = cli("service", "status", "--socket", str(sock))
    assert out.returncode == 3 and "not running" in out.stdout and str(sock) in out.stdout
    data = json.loads(cli("service", "status", "--json", "--socket", str(sock)).stdout)
    assert data["running"] is False and data["problem"] == "absent"


@pytest.mark.parametrize(
    "argv, words",
    [
        ((), "required"),
        (("start",), "invalid choice"),
        (("install", "--root", ""), "--root needs a directory"),
        (("install", "--bogus"), "unrecognized arguments"),
        (("status", "--socket"), "expected one argument"),
    ],
)
def test_bad_command_lines_are_one_error(cli: Any, argv: tuple[str, ...], words: str) -> None:
    out = cli("service", *argv)
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert words in out.stderr.splitlines()[-1], out.stderr


def test_install_refuses_a_program_other_users_cannot_run() -> None:
    """Issue 23: a venv whose Python lives in root's 0700 home went into ExecStart and
    gave every student `bad interpreter: Permission denied`."""
    import tempfile

    from gpuwarden.service.runnable import not_for_everyone

    tmp_path = Path(tempfile.mkdtemp(prefix="gw-exec-"))  # /tmp: everyone may enter
    home = tmp_path / "home"
    (home / "py").mkdir(parents=True)
    python = home / "py" / "python3"
    python.write_text("")
    python.chmod(0o755)
    script = tmp_path / "gpuwarden"
    script.write_text(f"#!{python}\nprint('hi')\n")
    script.chmod(0o755)
    tmp_path.chmod(0o755)
    home.chmod(0o700)
    assert not_for_everyone(str(script)) == f"other users may not enter {home}"
    home.chmod(0o755)
    assert not_for_everyone(str(script)) is None
    script.chmod(0o750)
    assert not_for_everyone(str(script)) == f"other users may not run {script}"
    shutil.rmtree(tmp_path)


def test_install_sets_up_the_exporter_and_web_units_too_and_uninstall_removes_them(
    tmp_path: Path,
) -> None:
    """Issue 23: the web page's and the exporter's units were left to copy by hand."""
    from gpuwarden.service import unitfiles

    lines = install.install(
        str(tmp_path), exec_start="/opt/gpuwarden/bin/gpuwarden", companions=("exporter", "web")
    )
    units = tmp_path / "etc/systemd/system"
    # The service watches health itself: its exporter does not, or each drain and post
    # would happen twice (the shipped unit, for machines with no service, does).
    watched = (
        "ExecStart=/usr/local/bin/gpuwarden exporter\n",
        unitfiles.WATCHED + "/usr/local/bin/gpuwarden exporter --no-watch\n",
    )
    for name, command in (
        ("gpuwarden-exporter", "exporter --no-watch"),
        ("gpuwarden-web", "web --no-watch"),
    ):
        text = (units / f"{name}.service").read_text()
        assert f"ExecStart=/opt/gpuwarden/bin/gpuwarden {command}\n" in text
        assert any(str(units / f"{name}.service") in line for line in lines)
        shipped = (ROOT / "deploy" / f"{name}.service").read_text().replace(*watched)
        assert text == shipped.replace("/usr/local/bin/gpuwarden", "/opt/gpuwarden/bin/gpuwarden")
        assert unitfiles.companion_unit(f"{name}.service", "/usr/local/bin/gpuwarden") == shipped
    stop = install.stop_commands(str(tmp_path))
    assert ["systemctl", "disable", "--now", "gpuwarden-web"] in stop
    assert install.start_commands(("exporter", "web"))[-1][-2:] == [
        "gpuwarden-exporter",
        "gpuwarden-web",
    ]
    uninstall.uninstall(str(tmp_path))
    assert not (units / "gpuwarden-web.service").exists()
    assert not (units / "gpuwarden-exporter.service").exists()
