"""`gpuwarden doctor` on the queue service: running and reachable, of another protocol
version, unreachable for this user, stale, absent, and recommended where the lease
directory is the shared world-writable one."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Optional

import pytest

from gpuwarden.doctor.checks.service import check_service
from gpuwarden.doctor.facts import NO_TORCH_ENV, Facts
from gpuwarden.machine.inventory import Snapshot
from gpuwarden.queueclient.probe import probe
from hermetic import hermetic
from repo import SRC
from servicetools import USER_PY, Server, become
from users import make_user

NO_TORCH = {NO_TORCH_ENV: "1"}


def doctor_findings(cli: Any, sock: str, **env: str) -> dict[str, dict[str, Any]]:
    out = cli("doctor", "--json", env={**NO_TORCH, "GPUWARDEN_SOCKET": sock, **env})
    assert out.stdout, out.stderr
    return {f["check"]: f for f in json.loads(out.stdout)["findings"]}


def judged(found: Optional[dict[str, Any]], shared: Optional[bool] = False) -> list[Any]:
    facts = Facts(
        snapshot=Snapshot(taken_at=0.0, hostname="h"),
        lease_dir="/var/lib/gpuwarden/leases",
        lease_dir_shared=shared,
        service=found,
    )
    return check_service(facts)


@pytest.fixture
def service(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Server]:
    """A real `gpuwarden serve` (root) on a socket in a directory every user may enter."""
    if os.geteuid() != 0:
        pytest.skip("the service runs as root")
    base = Path(tempfile.mkdtemp(prefix="gw-doctor-"))  # pytest's tmp_path is root's only
    (base / "work").mkdir()
    (base / "sock").mkdir()
    for d in (base, base / "work", base / "sock"):
        d.chmod(0o755)
    monkeypatch.setenv("GPUWARDEN_LEASE_DIR", str(tmp_path / "service-leases"))
    srv = Server(tmp_path, base / "work", ())
    srv.start()
    yield srv
    if srv.proc and srv.proc.poll() is None:
        srv.kill(signal.SIGTERM)
    shutil.rmtree(base, ignore_errors=True)


def test_a_running_service_passes_and_says_who_you_are(service: Server, cli: Any) -> None:
    found = doctor_findings(cli, service.socket)
    assert found["service"]["level"] == "PASS", found
    assert "protocol 1" in found["service"]["title"]
    assert "knows you as root, an admin" in found["service"]["title"]
    assert "none queued or running" in found["service"]["saw"]


def test_another_user_reaches_it_or_is_told_they_cannot(service: Server) -> None:
    alice = make_user("alice")
    code = "import json, sys; from gpuwarden.queueclient.probe import probe; "
    code += "print(json.dumps(probe(sys.argv[1])))"

    def as_alice() -> dict[str, Any]:
        done = subprocess.run(
            [USER_PY, "-c", code, service.socket],
            env={**hermetic(), "PYTHONPATH": str(SRC), "PATH": "/usr/bin:/bin"},
            capture_output=True,
            text=True,
            timeout=60,
            preexec_fn=become(alice),
            cwd="/",
        )
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout)

    found = as_alice()
    assert found["running"] and found["user"] == "gw-alice" and found["admin"] is False
    assert judged(found)[0].level == "PASS"
    os.chmod(os.path.dirname(service.socket), 0o700)  # an admin's mistake
    found = as_alice()
    assert found["problem"] == "denied"
    (finding,) = judged(found)
    assert finding.check == "service.access" and finding.level == "FAIL"


@contextlib.contextmanager
def answering(path: str, reply: dict[str, Any]) -> Iterator[None]:
    """A listener at `path` that answers every line with `reply` (another version)."""
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(4)

    def serve() -> None:
        with contextlib.suppress(OSError):
            while True:
                conn, _ = listener.accept()
                with conn:
                    if conn.recv(65536):
                        conn.sendall(json.dumps(reply).encode() + b"\n")

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield
    finally:
        listener.shutdown(socket.SHUT_RDWR)
        listener.close()


def test_a_service_of_another_protocol_version_fails(tmp_path: Path) -> None:
    path = str(tmp_path / "v2.sock")
    error = "protocol version 1 is not supported (this service: 2)"
    with answering(path, {"v": 2, "ok": False, "error": error}):
        found = probe(path)
    assert found["running"] and found["version"] == 2 and found["problem"] == "other-version"
    (finding,) = judged(found)
    assert finding.check == "service.version" and finding.level == "FAIL"
    assert "protocol 2" in finding.title and "speaks 1" in finding.title


def test_a_stale_socket_warns(tmp_path: Path, cli: Any) -> None:
    path = str(tmp_path / "stale.sock")
    dead = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    dead.bind(path)  # bound, never listening: what a killed service leaves
    try:
        found = doctor_findings(cli, path)
    finally:
        dead.close()
    assert found["service"]["level"] == "WARN" and "no service answers" in found["service"]["title"]
    assert "systemctl restart gpuwarden" in found["service"]["fix"]


def test_a_silent_service_is_not_waited_on_forever(tmp_path: Path) -> None:
    path = str(tmp_path / "silent.sock")
    quiet = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    quiet.bind(path)
    quiet.listen(1)  # accepts into the backlog, never answers
    try:
        found = probe(path, timeout=0.5)
    finally:
        quiet.close()
    assert found["problem"] == "silent" and not found["running"]
    assert judged(found)[0].level == "WARN"


def test_without_a_service_on_a_shared_lease_directory_it_is_recommended(
    tmp_path: Path, cli: Any
) -> None:
    shared = tmp_path / "shared-leases"
    shared.mkdir()
    shared.chmod(0o1777)
    absent = str(tmp_path / "none.sock")
    found = doctor_findings(cli, absent, GPUWARDEN_LEASE_DIR=str(shared))
    assert "service" not in found
    advice = found["service.recommended"]
    assert advice["level"] == "WARN" and "gpuwarden service install" in advice["fix"]
    assert "block everyone" in advice["title"]
    private = doctor_findings(cli, absent)  # the per-user directory of the test
    assert private["service"]["level"] == "INFO" and "service.recommended" not in private


def test_something_else_at_the_socket_path_warns(tmp_path: Path) -> None:
    path = tmp_path / "file.sock"
    path.write_text("")
    found = probe(str(path))
    assert found["problem"] == "not-a-socket"
    assert judged(found)[0].level == "WARN"
    assert judged(None) == []


def test_service_status_reports_socket_version_and_queue(service: Server, cli: Any) -> None:
    out = cli("service", "status", "--socket", service.socket)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0] == f"running: answers on {service.socket}"
    assert "protocol: version 1 (this gpuwarden: 1)" in lines
    assert "you: root (an admin)" in lines and "jobs: none queued or running" in lines
    fields = {"argv": ["true"], "cwd": str(service.work), "env": {"PATH": "/usr/bin:/bin"}}
    for _ in range(2):
        assert "job" in service.call(None, "submit", hold=True, **fields)
    data = json.loads(cli("service", "status", "--json", "--socket", service.socket).stdout)
    assert data["running"] and data["version"] == 1 and data["jobs"] == {"HELD": 2}
    assert "jobs: 2 held" in cli("service", "status", "--socket", service.socket).stdout


def test_the_doctor_knows_a_stopped_service_and_never_suggests_what_is_done() -> None:
    """Issue 23: with the service running the doctor said PASS and also "leases are
    private ... run sudo gpuwarden service install"; installed but stopped it said
    "commands work alone", while `run` then failed on alloc.lock."""
    from gpuwarden.doctor.checks.machine import check_machine

    stopped = {"running": False, "problem": "absent", "socket": "/run/x.sock", "installed": True}
    (finding,) = judged(stopped)
    assert (finding.check, finding.level) == ("service.stopped", "WARN")
    assert "systemctl start gpuwarden" in finding.fix and "install" not in finding.fix
    for service in (stopped, {"running": True, "socket": "/run/x.sock", "version": 1}):
        facts = Facts(
            snapshot=Snapshot(taken_at=0.0, hostname="h"),
            lease_dir="/var/lib/gpuwarden/leases",
            lease_dir_shared=False,
            service=service,
        )
        assert not [f for f in check_machine(facts) if f.check == "machine.sharing"]
    absent = {"running": False, "problem": "absent", "socket": "/run/x.sock", "installed": False}
    assert judged(absent)[0].check == "service"  # not installed: works alone, as before


def test_a_client_of_another_release_is_told_in_one_line_with_the_line_that_matches(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """A student's venv left behind by an upgrade: doctor's fix names the service's
    release (pip keeps an installed gpuwarden unless the line asks for another), and
    the client says it once, on the first answer that carries the release."""
    from gpuwarden import __version__
    from gpuwarden.queueclient import client

    wheels = "/opt/gpuwarden/share/gpuwarden/wheels"
    found = {"running": True, "socket": "/run/gpuwarden/gpuwarden.sock", "version": 1}
    [_, told] = judged({**found, "release": "9.9", "wheels": wheels})
    assert (told.check, told.level) == ("service.release", "WARN")
    assert told.fix.endswith(
        f"python -m pip install --no-index --find-links {wheels} gpuwarden==9.9"
    )
    [_, same] = judged({**found, "release": __version__, "wheels": wheels})
    assert same.check == "service.client" and same.fix.endswith(f"{wheels} gpuwarden")

    # A wheels folder holding pip's: pip 25 or later goes in first, whose console
    # scripts import no `re` (scripts/install-system puts it there).
    folder = tmp_path / "wheels"
    folder.mkdir()
    (folder / "pip-26.0-py3-none-any.whl").touch()
    [_, both] = judged({**found, "release": __version__, "wheels": str(folder)})
    pip, gpuwarden = both.fix.split(" && ")
    assert pip.endswith(f"python -m pip install --no-index --find-links {folder} 'pip>=25'")
    assert gpuwarden == pip.replace("'pip>=25'", "gpuwarden")

    monkeypatch.setattr(client, "_TOLD", [])
    for theirs in ("9.9", "9.9", "9.8"):
        client._compare_release(theirs)
    client._compare_release(__version__)
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1, lines
    assert lines[0].endswith(
        f"is gpuwarden {__version__}, the service 9.9: install the service's into it "
        "(`gpuwarden doctor` says how)"
    )
