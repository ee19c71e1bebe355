"""Shared fixtures: every test runs against throw-away state, never the developer's.

Leases, drains, config files and the simulated machine's state all live under
the test's own temporary directory, so tests can run in parallel and a
developer's real `~/.config/gpuwarden` or `/etc/gpuwarden` is never read.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from hypothesis import settings

from components import TORCH_MISSING, require, torch_found
from repo import SRC
from waiting import wait_for

# The queue service's fixtures (`open_dir`, `server`) are every test module's, as these
# are, so that no test module imports another to reach them.
pytest_plugins = ("servicetools", "rawservice")

# No per-example time limit: hypothesis's deadline measures wall-clock time, which on
# a 2-core CI machine shared with other work fails correct code at random (a test
# that must be fast says so with its own assertion).
settings.register_profile("gpuwarden", deadline=None)
settings.load_profile("gpuwarden")

# A suite started in the background of a non-interactive shell (`scripts/soak &`, a CI
# step run with `&`) inherits SIGINT ignored, and an ignored signal stays ignored
# across exec: every command a test interrupts with Ctrl-C would ignore it too. The
# commands are tested as a terminal starts them, with the default.
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

_CLEARED = (
    "GPUWARDEN_SIM",
    "GPUWARDEN_DEVICE",
    "GPUWARDEN_MEM_LIMIT",
    "CUDA_VISIBLE_DEVICES",
    "CUDA_DEVICE_ORDER",
    "GPU_IDS",
    "RANK",
    "LOCAL_RANK",
    "WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
)


def _job_cgroups() -> set[str]:
    """The job cgroups gpuwarden made under every hierarchy's `gpuwarden` directory
    (`run-*` of `gpuwarden run`, `svc-*` of a queue service): the whole machine's, the
    suite's own among them."""
    found: set[str] = set()
    base = Path("/sys/fs/cgroup")
    for parent in (*base.glob("*/gpuwarden"), base / "gpuwarden"):
        try:
            found.update(str(p) for p in parent.iterdir() if p.name.startswith(("run-", "svc-")))
        except OSError:
            continue
    return found


def _own_scopes(basetemp: Path) -> set[str]:
    """The cgroup scopes of the services this session started: every service's state
    lies below the session's temporary folder, and its scope is named after it
    (service.jobcgroup.scope_of)."""
    from gpuwarden.service.jobcgroup import scope_of

    scopes: set[str] = set()
    for folder, dirs, _ in os.walk(basetemp):
        if "jobs" in dirs:
            scopes.add(scope_of(os.path.join(folder, "jobs")))
    return scopes


def _descends_from(pid: int, ancestor: int) -> bool:
    while pid > 1:
        if pid == ancestor:
            return True
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
            pid = int(stat.rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            return False
    return False


def _ours(path: str, scopes: set[str]) -> bool:
    """Whether a job cgroup is this session's to judge: a scope of one of its services,
    or a `run` cgroup whose wrapper is this session's (or gone: then it is no one's and
    any root `run` removes it once empty). Another session's, or a live system
    service's, is never judged nor removed."""
    from gpuwarden.cgroups.devices import owner_pid

    name = os.path.basename(path)
    if name.startswith("svc-"):
        return name in scopes
    wrapper = owner_pid(name)
    if wrapper is None:
        return False
    return not os.path.exists(f"/proc/{wrapper}") or _descends_from(wrapper, os.getpid())


def _remove_empty(path: str) -> None:
    """rmdir a job cgroup and the groups inside it, deepest first: the kernel refuses
    one that holds a process, so only what is empty goes. A group made in the last
    second is left: it may be between its `mkdir` and its first process joining."""
    young = time.time() - 1.0
    for inner, _, _ in os.walk(path, topdown=False):
        with contextlib.suppress(OSError):
            if os.stat(inner).st_mtime < young:
                os.rmdir(inner)


@pytest.fixture(autouse=True, scope="session")
def no_cgroup_trail(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """The suite leaves no cgroup behind. A job's cgroup, or a stopped service's
    directory, that was not empty yet when its owner tried to remove it (a process of
    the job still on its way out) is removed here once it is, as the next root `run`
    or a restarted service would; one that still holds a process after a few seconds
    is a job that outlived its test, and fails the suite. Only the session's own are
    judged (`_ours`): the machine's own service, and other sessions, keep theirs."""
    before = _job_cgroups()
    yield
    scopes = _own_scopes(tmp_path_factory.getbasetemp())

    def left() -> set[str]:
        return {p for p in _job_cgroups() - before if _ours(p, scopes)}

    def gone() -> bool:
        trail = left()
        for path in trail:
            _remove_empty(path)
        return not trail

    wait_for(
        gone, 5, lambda: f"the tests left job cgroups with processes in them: {sorted(left())}"
    )


@pytest.fixture(autouse=True)
def isolated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """Point every gpuwarden location at `tmp_path` and clear GPU-related variables."""
    for name in list(os.environ):
        if name in _CLEARED or name.startswith(("SLURM_", "OMPI_", "PMI_", "TORCHELASTIC_")):
            monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("GPUWARDEN_LEASE_DIR", str(tmp_path / "leases"))
    monkeypatch.setenv("GPUWARDEN_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setenv("GPUWARDEN_SYSTEM_CONFIG", str(tmp_path / "etc" / "config.toml"))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg-config"))
    monkeypatch.setenv("GPUWARDEN_SIM_STATE", str(tmp_path / "sim"))
    monkeypatch.setenv(
        "GPUWARDEN_SOCKET", str(tmp_path / "no-service.sock")
    )  # none, unless a test starts one
    work = tmp_path / "cwd"
    work.mkdir()
    monkeypatch.chdir(work)
    yield tmp_path


@pytest.fixture
def sim(monkeypatch: pytest.MonkeyPatch) -> Callable[[str], str]:
    """`sim("server-8xa100")` makes this test (and its subprocesses) see that machine."""

    def use(spec: str = "server-8xa100") -> str:
        monkeypatch.setenv("GPUWARDEN_SIM", spec)
        return spec

    return use


@pytest.fixture
def cli() -> Callable[..., subprocess.CompletedProcess[str]]:
    """Run `python -m gpuwarden ARGS` as a real process, with the test's environment."""

    def run(
        *args: str, env: dict[str, str] | None = None, timeout: float = 60, **kw: object
    ) -> subprocess.CompletedProcess[str]:
        full_env = dict(os.environ)
        full_env["PYTHONPATH"] = os.pathsep.join(
            p for p in (str(SRC), full_env.get("PYTHONPATH", "")) if p
        )
        if env:
            full_env.update(env)
        return subprocess.run(
            [sys.executable, "-m", "gpuwarden", *args],
            env=full_env,
            capture_output=True,
            text=True,
            timeout=timeout,
            **kw,  # type: ignore[arg-type]
        )

    return run


@pytest.fixture
def torch_installed() -> None:
    """For tests of what gpuwarden does with a real torch install (found, probed, run)."""
    require(torch_found(), TORCH_MISSING)


@pytest.fixture
def peer(tmp_path) -> Iterator[str]:
    """`gpuwarden web` of another machine (a workstation with dave on GPU 1): its URL."""
    env = dict(
        os.environ,
        PYTHONPATH=str(SRC),
        GPUWARDEN_SIM="workstation-3x3090",
        GPUWARDEN_SIM_STATE=str(tmp_path / "peer-sim"),
        GPUWARDEN_LEASE_DIR=str(tmp_path / "peer-leases"),
        GPUWARDEN_STATE_DIR=str(tmp_path / "peer-state"),
    )
    proc = subprocess.Popen(
        [sys.executable, "-m", "gpuwarden", "web", "--listen", "127.0.0.1:0", "--no-watch"],
        env=env,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stderr is not None
        line = proc.stderr.readline()  # blocks until the server says where it is
        assert "serving http://127.0.0.1:" in line, line
        yield line.split("serving ", 1)[1].split()[0]
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(30)
