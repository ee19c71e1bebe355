"""The queue service as its tests get it: a real `gpuwarden serve`, as root, with real
Unix users as clients.

Every test of the service, whatever module it is in, starts and talks to the service
the same way, so a change to how the service starts (a flag, a folder's mode) is made
here once. The fixtures `open_dir` and `server` are every test's (tests/conftest.py
loads this module as a plugin); the rest is imported by name.

The service runs as a real process on a simulated server of four idle A100s
(tests/data/idle-4xa100.toml); clients connect as real users (identity from
SO_PEERCRED), and jobs run as their owners. A test that needs users skips where they
cannot be made, and fails under CI, which runs as root.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Optional

import pytest

from gpuwarden.queueclient.probe import wait_until_running
from gpuwarden.service import store as st
from gpuwarden.service.identity import Person
from hermetic import hermetic
from repo import SRC
from users import make_user
from waiting import wait_for

#: The machine the service simulates unless a test names another.
SPEC = str(Path(__file__).resolve().parent / "data" / "idle-4xa100.toml")
#: The interpreter a job or client runs as another user: the system's, which every user
#: may run (the suite's own may live under root's home).
USER_PY = shutil.which("python3", path="/usr/bin:/bin") or sys.executable

# One request as a user: the service's answer as JSON, or its refusal as "ERROR ...".
CLIENT = """
import json, sys
from gpuwarden.base.errors import UserError
from gpuwarden.queueclient.client import require
try:
    with require(sys.argv[1]) as c:
        print(json.dumps(c.call(sys.argv[2], **json.loads(sys.argv[3]))))
except UserError as err:
    print("ERROR " + str(err))
    sys.exit(2)
"""


class Server:
    """One `gpuwarden serve` process, its socket, state and log; it can be killed and
    started again on the same state, as a restart of the real service."""

    def __init__(self, root: Path, work: Path, args: tuple[str, ...], spec: str = SPEC) -> None:
        self.spec = spec  # the simulated machine it serves
        self.root = root
        self.work = work
        self.socket = str(work.parent / "sock" / "gpuwarden.sock")
        self.state = str(root / "service")
        self.args = args
        self.proc: Optional[subprocess.Popen[str]] = None
        self.log = root / "serve.log"

    def start(self) -> None:
        """Start the service and return once it answers (its log in the failure)."""
        env = dict(os.environ, PYTHONPATH=str(SRC), GPUWARDEN_SIM=self.spec)
        with contextlib.suppress(OSError):
            os.unlink(self.socket)
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "gpuwarden",
                "serve",
                "--socket",
                self.socket,
                "--state-dir",
                self.state,
                "--log-level",
                "DEBUG",
                *self.args,
            ],
            env=env,
            stdout=open(self.log, "a"),  # noqa: SIM115 - the process owns it
            stderr=subprocess.STDOUT,
            text=True,
        )
        proc = self.proc
        found = wait_until_running(self.socket, 30, alive=lambda: proc.poll() is None)
        assert found["running"], f"the service did not start: {found['error']}\n" + (
            self.log.read_text()
        )

    def job_pid(self, job: st.Job) -> Optional[int]:
        """A started job's pid: the journal's, or its supervisor's marker's (a RUNNING
        job's pid reaches the journal with the service's next commit; the marker has it
        from the job's start, as a restarted service reads it)."""
        from gpuwarden.service.joblife import exits_folder
        from gpuwarden.service.marker import read_marker

        if job.pid:
            return job.pid
        return (read_marker(exits_folder(self.state), str(job.id)) or {}).get("pid")

    def pid_of(self, job_id: int) -> int:
        """The pid of running job `job_id`, as `job_pid` finds it."""
        journal = st.Store(os.path.join(self.state, "jobs.db"))
        try:
            pid = self.job_pid(journal.get(job_id))
        finally:
            journal.close()
        assert pid, f"job {job_id} has no pid yet"
        return pid

    def kill_jobs(self) -> None:
        """End what the test left running: jobs outlive the service by design."""
        journal = st.Store(os.path.join(self.state, "jobs.db"))
        for job in journal.jobs(st.ACTIVE):
            for pid in (self.job_pid(job), job.supervisor):
                if pid:
                    with contextlib.suppress(OSError):
                        os.killpg(pid, signal.SIGKILL)
        journal.close()
        self.forget_cgroups()

    def forget_cgroups(self) -> None:
        """Remove the job cgroups a killed service left (a restarted one would sweep them;
        this one is not restarted), so tests leave no trail under /sys/fs/cgroup. What is
        still not empty after a while is left to conftest's `no_cgroup_trail`, which
        fails the suite over it."""
        from gpuwarden.service import jobcgroup

        scope = jobcgroup.scope_of(os.path.join(self.state, "jobs"))
        deadline = time.monotonic() + 10
        while (left := jobcgroup.service_jobs(scope)) and time.monotonic() < deadline:
            if not all([jobcgroup.remove_job(dirs) for dirs in left.values()]):
                time.sleep(0.02)  # SIGKILLed processes are still on their way out
        jobcgroup.remove_scope(scope)

    def kill(self, sig: int = signal.SIGKILL) -> None:
        """Signal the service and wait for it to end (SIGKILL: a crash; SIGTERM: a stop)."""
        assert self.proc is not None
        self.proc.send_signal(sig)
        self.proc.wait(30)

    def call(self, who: Optional[Person], op: str, **fields: Any) -> dict[str, Any]:
        """`op` as `who` (root when None); an error answer comes back as {"error": ...}."""
        env = {
            "PYTHONPATH": str(SRC),
            **hermetic(),
            "PATH": "/usr/bin:/bin",
            "USER": "root",
            "LOGNAME": "root",
        }
        run = subprocess.run(
            [USER_PY if who else sys.executable, "-c", CLIENT, self.socket, op, json.dumps(fields)],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
            preexec_fn=None if who is None else become(who),
            cwd=str(self.work),
        )
        out = run.stdout.strip()
        if out.startswith("ERROR "):
            return {"error": out[6:]}
        assert run.returncode == 0, run.stderr
        return json.loads(out)

    def job(self, job_id: int) -> dict[str, Any]:
        """The job's row, whether it is still queued or running or has ended."""
        active, ended = self.call(None, "queue"), self.call(None, "jobs", limit=1000)
        assert "jobs" in active and "jobs" in ended, (active, ended)
        rows = active["jobs"] + ended["jobs"]
        return next(r for r in rows if r["id"] == job_id)

    def wait_state(
        self, job_id: int, states: tuple[str, ...], timeout: float = 30
    ) -> dict[str, Any]:
        """The job's row once it is in one of `states`; failing, its last row and the
        service's log, which says why it is not."""
        row: dict[str, Any] = {}

        def reached() -> Optional[dict[str, Any]]:
            row.clear()
            row.update(self.job(job_id))
            return dict(row) if row["state"] in states else None

        return wait_for(
            reached,
            timeout,
            lambda: f"job {job_id} stayed {row.get('state')}: {row}\n{self.log_tail()}",
        )

    def log_tail(self, chars: int = 3000) -> str:
        """The end of the service's log: what a failure message shows of it."""
        return self.log.read_text()[-chars:]

    def wait_log(self, text: str, times: int = 1, timeout: float = 30) -> None:
        """Wait until the service's log says `text` at least `times` times."""
        wait_for(
            lambda: self.log.read_text().count(text) >= times,
            timeout,
            lambda: f"{text!r} {times} time(s) in the service's log\n{self.log_tail()}",
        )


def become(who: Person) -> Callable[[], None]:
    """A `preexec_fn` that makes the child `who`: groups first, then gid, then uid (once
    the uid is dropped the others can no longer be changed)."""

    def drop() -> None:
        os.setgroups(list(who.groups))
        os.setgid(who.gid)
        os.setuid(who.uid)

    return drop


@pytest.fixture
def open_dir() -> Iterator[Path]:
    """A folder every user may reach, outside pytest's tmp_path (root's, 0700 on the
    way): `work` (sticky, world-writable: the jobs' cwd and output) and `sock` (the
    service's socket); removed after the test."""
    d = Path(tempfile.mkdtemp(prefix="gw-service-"))
    d.chmod(0o755)
    for name, mode in (("work", 0o1777), ("sock", 0o755)):
        (d / name).mkdir()
        (d / name).chmod(mode)
    yield d
    shutil.rmtree(d, ignore_errors=True)


def serving(
    tmp_path: Path, open_dir: Path, monkeypatch: pytest.MonkeyPatch, *args: str, spec: str = SPEC
) -> Iterator[Server]:
    """A started service with gw-carol as its admin and a one-second grace (extra
    flags in `args`), stopped after the test and its jobs ended. Leases and drains go
    to root directories of 0755, as `gpuwarden service install` makes them, so what
    users may do with them is what they may do on a real install."""
    make_user("alice", groups=("lab",))
    for name, variable in (("leases", "GPUWARDEN_LEASE_DIR"), ("drains", "GPUWARDEN_STATE_DIR")):
        (open_dir / name).mkdir(mode=0o755)
        monkeypatch.setenv(variable, str(open_dir / name))
    srv = Server(tmp_path, open_dir / "work", ("--admin", "gw-carol", "--grace", "1s", *args), spec)
    srv.start()
    yield srv
    if srv.proc and srv.proc.poll() is None:
        srv.kill(signal.SIGTERM)
    srv.kill_jobs()


@pytest.fixture
def server(tmp_path: Path, open_dir: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Server]:
    """The service with its defaults (`serving`) on the simulated four A100s."""
    yield from serving(tmp_path, open_dir, monkeypatch)


def submit(srv: Server, who: Person, argv: list[str], **kw: Any) -> int:
    """Submit `argv` as `who` in the shared work folder (extra request fields in `kw`);
    the job's id. $USER says bob whoever submits: the service must not believe it."""
    fields = {"argv": argv, "cwd": str(srv.work), "env": {"PATH": "/usr/bin:/bin", "USER": "bob"}}
    fields.update(kw)
    reply = srv.call(who, "submit", **fields)
    assert "job" in reply, reply
    return int(reply["job"])


def cli_as(srv: Server, who: Person, *args: str) -> subprocess.CompletedProcess[str]:
    """`gpuwarden ARGS` as `who` against this service, as a user types it."""
    env = {
        **hermetic(),
        "PYTHONPATH": str(SRC),
        "PATH": "/usr/bin:/bin",
        "GPUWARDEN_SOCKET": srv.socket,
    }
    return subprocess.run(
        [USER_PY, "-m", "gpuwarden", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        preexec_fn=become(who),
        cwd=str(srv.work),
    )


def cli_with_gpus(
    srv: Server, who: Person, *args: str, socket: Optional[str] = None, **extra: str
) -> subprocess.CompletedProcess[str]:
    """`gpuwarden ARGS` as `who` on the simulated machine, with the service's lease
    directory (the simulator stands behind nvidia-ml-py's module: a copy they can read)."""
    from gpuwarden.sim.fake import real_pynvml_path

    lib = srv.work.parent / "lib"
    if not lib.exists():
        lib.mkdir(mode=0o755)
        shutil.copy(real_pynvml_path(), lib / "pynvml.py")
    env = {
        "PYTHONPATH": f"{SRC}:{lib}",
        **hermetic(),
        "PATH": "/usr/bin:/bin",
        "GPUWARDEN_SOCKET": socket or srv.socket,
        "GPUWARDEN_SIM": SPEC,
        "GPUWARDEN_LEASE_DIR": os.environ["GPUWARDEN_LEASE_DIR"],
        **extra,
    }
    return subprocess.run(
        [USER_PY, "-m", "gpuwarden", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        preexec_fn=become(who),
        cwd=str(srv.work),
    )


def attached_again(srv: Server, times: int, timeout: float = 30) -> None:
    """Wait until the service's log says an attached client came back `times` times."""
    srv.wait_log("its client attached again", times, timeout)
