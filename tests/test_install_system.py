"""The install for a lab (issue 23): `scripts/install-system` from a fresh clone puts
gpuwarden in a virtual environment on the system Python (PEP 668 refuses `sudo pip
install` on Debian 12 and Ubuntu 24.04) with a link on everyone's PATH; a student
then runs `status` and `submit` to the service started from that install.

Under a temporary prefix, not /opt, so that the machine running the tests is left as
it was. pip installs the clone with its usual configuration (cache, find-links,
index).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from components import require
from users import make_user
from waiting import wait_for

ROOT = Path(__file__).resolve().parent.parent
SPEC = str(Path(__file__).resolve().parent / "data" / "idle-4xa100.toml")
SYSTEM_PY = "/usr/bin/python3"


@pytest.fixture
def place() -> Iterator[Path]:
    d = Path(tempfile.mkdtemp(prefix="gw-install-"))
    d.chmod(0o755)  # every user reaches the install, as /opt
    yield d
    shutil.rmtree(d, ignore_errors=True)


def _as(
    user: str, argv: list[str], env: dict[str, str], cwd: Path
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["runuser", "-u", user, "--", "env", "-i", *(f"{k}={v}" for k, v in env.items()), *argv],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=str(cwd),
    )


def _imported(done: subprocess.CompletedProcess[str]) -> set[str]:
    """The modules a command run under `-X importtime` imported."""
    assert done.returncode == 0, done.stderr[-3000:]
    cells = [line.split("|") for line in done.stderr.splitlines()]
    return {c[2].strip() for c in cells if len(c) == 3 and "imported package" not in c[2]}


@pytest.mark.slow
def test_a_fresh_clone_installs_for_every_user_and_a_student_submits(place: Path) -> None:
    require(os.geteuid() == 0 and shutil.which("runuser") is not None, "needs root and runuser")
    require(os.access(SYSTEM_PY, os.X_OK), f"needs the system Python at {SYSTEM_PY}")
    require(shutil.which("git") is not None and (ROOT / ".git").exists(), "needs a git checkout")
    alice = make_user("alice")
    clone = place / "clone"
    subprocess.run(["git", "clone", "--quiet", str(ROOT), str(clone)], check=True, timeout=120)
    prefix, bindir = place / "opt" / "gpuwarden", place / "bin"
    done = subprocess.run(
        [str(clone / "scripts" / "install-system"), "--prefix", str(prefix), "--bin", str(bindir)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.startswith("installed gpuwarden "), done.stdout
    program = bindir / "gpuwarden"
    assert os.path.realpath(program) == str(prefix / "bin" / "gpuwarden")
    venv_python = os.path.realpath(prefix / "bin" / "python")
    assert not venv_python.startswith(("/root", "/home")), venv_python  # the system one
    # Every start of the install's interpreter (each command of every user) runs what a
    # .pth file says: none is left (setuptools' distutils shim was one).
    site = list(prefix.glob("lib/python3*/site-packages"))
    assert len(site) == 1 and (site[0] / "gpuwarden").is_dir(), site
    assert not list(site[0].glob("*.pth")), sorted(p.name for p in site[0].glob("*.pth"))

    work = place / "work"
    work.mkdir(mode=0o1777)
    work.chmod(0o1777)
    (place / "run").mkdir(mode=0o755)
    leases = place / "leases"
    leases.mkdir(mode=0o755)
    sock = str(place / "run" / "gpuwarden.sock")
    from hermetic import hermetic

    env = {
        **hermetic(),  # never the machine's own config, state or service
        "PATH": f"{bindir}:/usr/bin:/bin",
        "GPUWARDEN_SIM": SPEC,
        "GPUWARDEN_SOCKET": sock,
        "GPUWARDEN_LEASE_DIR": str(leases),
        "HOME": alice.home,
    }
    status = _as(alice.name, ["gpuwarden", "status"], env, work)
    assert status.returncode == 0, status.stderr
    assert "A100-SXM4-80GB" in status.stdout

    service = subprocess.Popen(
        [str(program), "serve", "--socket", sock, "--state-dir", str(place / "state")],
        env={**env, "HOME": "/root"},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:

        def listening() -> bool:
            assert service.poll() is None, service.stderr.read() if service.stderr else ""
            return os.path.exists(sock)

        wait_for(listening, 30, "the installed service's socket")
        submitted = _as(
            alice.name, ["gpuwarden", "submit", "--", "sh", "-c", "echo done-$(id -un)"], env, work
        )
        assert submitted.returncode == 0, submitted.stderr
        job = int(submitted.stdout)
        # What the install's console script loads beyond its interpreter's own start:
        # the short client, and none of the modules that cost a start several times
        # over (the console script of a pip before 25 imports `re`, and `enum` with it).
        timed = {**env, "PYTHONPROFILEIMPORTTIME": "1"}
        floor = _imported(
            _as(alice.name, [str(prefix / "bin" / "python"), "-c", "pass"], timed, work)
        )
        held = ["gpuwarden", "submit", "--hold", "--", "true"]
        beyond = _imported(_as(alice.name, held, timed, work)) - floor
        assert "gpuwarden.queueclient.thin" in beyond, sorted(beyond)
        assert not beyond & {"re", "enum", "argparse", "json", "socket", "typing"}, sorted(beyond)
        out = work / f"gpuwarden-{job}.out"
        wait_for(lambda: out.exists() and out.read_text(), 60, "the job's output")
        assert out.read_text() == f"done-{alice.name}\n"
        assert out.stat().st_uid == alice.uid
    finally:
        service.send_signal(signal.SIGTERM)
        service.wait(30)
