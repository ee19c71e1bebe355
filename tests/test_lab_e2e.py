"""The lab recipe end to end, as README ("On a shared server") and docs/operations.md
say it: an admin installs from a fresh clone (`scripts/install-system`, then `service
install --exporter`) with `max_time` and per-group limits set; a real non-root student
with their own venv made from the system Python (ipykernel, jupyter_client, submitit
and the CPU torch wheel from the configured index) puts gpuwarden into it with the
line `gpuwarden doctor` prints; a kernel started by jupyter_client's KernelManager by
kernelspec name holds its GPU, keeps it across a restart and frees it at shutdown;
submitit's `map_array` of 10 runs; `run -g 2 --ddp -- $VENV/bin/python train.py` runs
both ranks with the venv's torch; `run -- bash -i` on the student's terminal suspends
and resumes with Ctrl-Z and `fg`; with no exporter running a fatal XID drains its GPU
and the service's log says so; an upgrade (install-system again, a restart) tells the
student's client of its other release in one line, and doctor's line matches them
again; the student takes gpuwarden out of their venv, the admin runs uninstall, then
`--purge`, then removes the install, and nothing of gpuwarden is left.

Under temporary prefixes (never /opt or /etc): `install-system --prefix --bin`,
`service install --root`, and the service started by hand on the simulated machine (no
systemd here), with the paths under that root.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from components import require
from ptys import login, suspend_and_resume
from users import make_user
from waiting import wait_for

ROOT = Path(__file__).resolve().parent.parent
SPEC = str(Path(__file__).resolve().parent / "data" / "idle-4xa100.toml")
SYSTEM_PY = "/usr/bin/python3"
#: What a student's venv has before gpuwarden: their notebook, sweeps and torch (CPU).
STUDENT_PACKAGES = ("ipykernel", "jupyter_client", "submitit", "torch==2.13.0+cpu")

CONFIG = """\
[service]
max_time = "1h"
[service.limits]
"@gw-students" = { max_gpus = 2, max_time = "30m" }
"""

KERNEL = r"""
import json, sys
from jupyter_client import KernelManager

def ask(km, code):
    kc = km.client(); kc.start_channels(); kc.wait_for_ready(timeout=120)
    out = []
    kc.execute_interactive(code, timeout=120,
        output_hook=lambda m: out.append(m["content"].get("text", "")))
    kc.stop_channels()
    return "".join(out).strip()

code = "import os; print(os.environ['CUDA_VISIBLE_DEVICES'], os.environ['GPUWARDEN_JOB'])"
km = KernelManager(kernel_name=sys.argv[1])
try:
    km.start_kernel()
except Exception as err:
    print(json.dumps({"error": str(err)}))
    sys.exit(0)
first = ask(km, code)
km.restart_kernel(now=True)
again = ask(km, code)
km.shutdown_kernel()
print(json.dumps({"first": first, "again": again}))
"""

SWEEP = r"""
import json, sys
import submitit

def square(x):
    return x * x

executor = submitit.AutoExecutor(sys.argv[1], cluster="gpuwarden")
executor.update_parameters(timeout_min=10, gpus_per_node=1, gpuwarden_array_parallelism=4)
jobs = executor.map_array(square, range(10))
print(json.dumps({"ids": [j.job_id for j in jobs], "results": [j.result() for j in jobs]}))
"""

TRAIN = """\
import os, torch
print("rank", os.environ["RANK"], "of", os.environ["WORLD_SIZE"], torch.__file__, flush=True)
"""


@pytest.fixture
def place() -> Iterator[Path]:
    d = Path(tempfile.mkdtemp(prefix="gw-lab-"))
    d.chmod(0o755)  # every user reaches the install, as /opt
    yield d
    shutil.rmtree(d, ignore_errors=True)


def _run(argv: list[str], env: dict[str, str], timeout: float = 120, **kw: object):  # type: ignore[no-untyped-def]
    return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=timeout, **kw)  # type: ignore[call-overload]


def _as(user: str, argv: list[str], env: dict[str, str], cwd: Path, timeout: float = 300):  # type: ignore[no-untyped-def]
    return subprocess.run(
        ["runuser", "-u", user, "--", "env", "-i", *(f"{k}={v}" for k, v in env.items()), *argv],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=str(cwd),
    )


@pytest.mark.slow
@pytest.mark.timeout(1800)  # two installs from the index and a venv with torch, under load
def test_the_lab_recipe_end_to_end_with_a_students_own_venv(place: Path) -> None:
    require(os.geteuid() == 0 and shutil.which("runuser") is not None, "needs root and runuser")
    require(os.access(SYSTEM_PY, os.X_OK), f"needs the system Python at {SYSTEM_PY}")
    require(shutil.which("git") is not None and (ROOT / ".git").exists(), "needs a git checkout")
    alice = make_user("alice", groups=("students",))

    # The admin: a fresh clone, install-system, service install --exporter.
    clone = place / "clone"
    subprocess.run(["git", "clone", "--quiet", str(ROOT), str(clone)], check=True, timeout=120)
    prefix, bindir = place / "opt" / "gpuwarden", place / "bin"
    done = _run(
        [str(clone / "scripts" / "install-system"), "--prefix", str(prefix), "--bin", str(bindir)],
        dict(os.environ),
        timeout=900,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    wheels = prefix / "share" / "gpuwarden" / "wheels"
    assert f"--find-links {wheels} gpuwarden" in done.stdout, done.stdout
    program = str(bindir / "gpuwarden")
    root = place / "root"
    installed = _run([program, "service", "install", "--root", str(root), "--exporter"], {})
    assert installed.returncode == 0, installed.stdout + installed.stderr
    assert (root / "etc/systemd/system/gpuwarden-exporter.service").exists()

    lib = root / "var" / "lib" / "gpuwarden"
    sock = root / "run" / "gpuwarden" / "gpuwarden.sock"
    conf = root / "etc" / "gpuwarden" / "config.toml"  # the admin's `sudoedit` of it
    assert "[service]" in conf.read_text()
    conf.write_text(CONFIG)
    sim_state = place / "sim"
    sim_state.mkdir(mode=0o755)
    common = {
        "PATH": "/usr/bin:/bin",
        "GPUWARDEN_SIM": SPEC,
        "GPUWARDEN_SIM_STATE": str(sim_state),
        "GPUWARDEN_SOCKET": str(sock),
        "GPUWARDEN_LEASE_DIR": str(lib / "leases"),
        "GPUWARDEN_STATE_DIR": str(lib / "state"),
        "GPUWARDEN_SYSTEM_CONFIG": str(conf),
    }
    log = place / "serve.log"
    service = _serve(program, lib, common, log)
    try:
        venv = _student(place, alice, program, wheels, common)
        injected = _run([program, "sim", "inject", "xid", "--gpu", "3", "79"], common)
        assert injected.returncode == 0, injected.stderr
        wait_for(
            lambda: "health watch drained GPU 3 (" in log.read_text(),
            60,
            lambda: "the drain in the service's log:\n" + log.read_text()[-3000:],
        )

        # An upgrade (the clone moves on; install-system again, then a restart): the
        # student's venv, of the release before, is told so in one line by its client,
        # and the line doctor prints then matches them again.
        init = clone / "src" / "gpuwarden" / "__init__.py"
        before = re.search(r'__version__ = "([^"]+)"', init.read_text())
        assert before, init.read_text()[:500]
        newer = before[1] + "+upgraded"
        init.write_text(init.read_text().replace(before[0], f'__version__ = "{newer}"'))
        again = _run(
            [str(clone / "scripts/install-system"), "--prefix", str(prefix), "--bin", str(bindir)],
            dict(os.environ),
            timeout=900,
        )
        assert again.returncode == 0 and newer in again.stdout, again.stdout + again.stderr
        # nothing an interpreter's start runs came back with the upgrade (install-system)
        assert not list(prefix.glob("lib/python3*/site-packages/*.pth"))
        service.send_signal(signal.SIGTERM)
        service.wait(60)
        service = _serve(program, lib, common, log)
        _upgraded(place, alice, venv, common, before[1], newer)
    finally:
        service.send_signal(signal.SIGTERM)
        service.wait(60)

    # The student takes gpuwarden out of their venv: its kernelspecs, then the package.
    work = place / "work"
    env = {**common, "HOME": alice.home, "JUPYTER_PLATFORM_DIRS": "1"}
    active = {**env, "VIRTUAL_ENV": str(venv), "PATH": f"{venv}/bin:/usr/bin:/bin"}
    for name in ("untimed", "lab"):
        gone = _as(
            alice.name, [str(venv / "bin/gpuwarden"), "kernel", "uninstall", name], active, work
        )
        assert gone.returncode == 0, gone.stderr
    py = str(venv / "bin/python")
    out = _as(alice.name, [py, "-m", "pip", "uninstall", "-y", "gpuwarden"], active, work)
    assert out.returncode == 0, out.stderr
    assert not list(venv.glob("lib/python3*/site-packages/gpuwarden*")), "gpuwarden in the venv"
    assert not list(venv.glob("bin/gpuwarden*"))
    kernels = Path(alice.home) / ".local/share/jupyter/kernels"
    assert not any((kernels / name).exists() for name in ("untimed", "lab"))

    # The admin: uninstall keeps the journal and its record; --purge then removes them,
    # and the install itself goes as docs/operations.md says (`rm -r` the prefix and link).
    kept = _run([program, "service", "uninstall", "--root", str(root)], common)
    assert kept.returncode == 0, kept.stdout + kept.stderr
    assert f"left {conf}: edited since install (--purge removes it)" in kept.stdout
    assert (lib / "service" / "install.json").exists() and (lib / "service" / "jobs.db").exists()
    purged = _run([program, "service", "uninstall", "--root", str(root), "--purge"], common)
    assert purged.returncode == 0, purged.stdout + purged.stderr
    assert "(--purge): " in purged.stdout and "jobs.db" in purged.stdout, purged.stdout
    assert f"removed {conf} (--purge), edited since install" in purged.stdout
    removed = _run(["rm", "-r", str(prefix), str(bindir / "gpuwarden")], {})
    assert removed.returncode == 0, removed.stderr
    left = [p for p in root.rglob("*") if not p.is_dir()]
    assert left == [], left
    assert not any("gpuwarden" in str(p) for p in root.rglob("*")), list(root.rglob("*"))
    assert not prefix.exists() and not os.path.lexists(bindir / "gpuwarden")
    assert not list(prefix.parent.iterdir()) and not list(bindir.iterdir())
    # What is left under the temporary place is the admin's and the test's own: the
    # clone, the simulator's state, the log, the student's work folder (their venv,
    # without gpuwarden).
    assert {p.name for p in place.iterdir()} <= {
        "clone",
        "sim",
        "serve.log",
        "work",
        "root",
        "opt",
        "bin",
    }


# The line `gpuwarden doctor` prints to put the service's gpuwarden into a venv: pip 25
# or later from the install's wheels first, then gpuwarden (of the service's release).
FIX = (
    r"(?:\S+ -m pip install --no-index --find-links \S+ 'pip>=25' && )?"
    r"\S+ -m pip install --no-index --find-links \S+ gpuwarden\S*"
)


def _student(place: Path, alice, program: str, wheels: Path, common: dict[str, str]) -> Path:  # type: ignore[no-untyped-def]
    """The student's part, as the README says it, in their own venv (returned)."""
    work = place / "work"
    work.mkdir(mode=0o755)
    os.chown(work, alice.uid, alice.gid)
    venv = work / "venv"
    env = {**common, "HOME": alice.home, "JUPYTER_PLATFORM_DIRS": "1", **_pip_settings()}
    made = _as(alice.name, [SYSTEM_PY, "-m", "venv", str(venv)], env, work)
    assert made.returncode == 0, made.stderr
    py = str(venv / "bin" / "python")
    deps = _as(
        alice.name,
        [py, "-m", "pip", "install", "-q", *STUDENT_PACKAGES],
        env,
        work,
        timeout=1200,
    )
    assert deps.returncode == 0, deps.stderr[-3000:]
    # `gpuwarden doctor` (the lab's) prints the line for the active venv; run as said.
    active = {**env, "VIRTUAL_ENV": str(venv), "PATH": f"{venv}/bin:/usr/bin:/bin"}
    doctor = _as(alice.name, [program, "doctor"], active, work)
    line = re.search(FIX, doctor.stdout)
    assert line, doctor.stdout
    pip = f"{py} -m pip install --no-index --find-links {wheels}"
    assert line.group(0) == f"{pip} 'pip>=25' && {pip} gpuwarden"  # pip first: see below
    put = _as(alice.name, ["sh", "-c", line.group(0)], active, work)
    assert put.returncode == 0, put.stderr[-3000:]
    # The console script of the venv's pip (25 or later, from the wheels) imports no `re`
    # (an older pip's does, and `enum` with it: ~10 ms on every gpuwarden command).
    assert "import re" not in (venv / "bin" / "gpuwarden").read_text()
    where = _as(alice.name, [py, "-c", "import gpuwarden; print(gpuwarden.__file__)"], active, work)
    assert where.stdout.startswith(str(venv)), where.stdout + where.stderr

    # A kernel by kernelspec name: refused without a time, naming the option; with one,
    # its GPU across a restart, the job completed at shutdown.
    gw = str(venv / "bin" / "gpuwarden")
    for name, more in (("untimed", []), ("lab", ["--time", "20m"])):
        spec = _as(alice.name, [gw, "kernel", "install", "--name", name, *more], active, work)
        assert spec.returncode == 0, spec.stderr
    refused = _as(alice.name, [py, "-c", KERNEL, "untimed"], active, work)
    assert "`gpuwarden kernel install --time` on every job" in refused.stdout, refused
    ran = _as(alice.name, [py, "-c", KERNEL, "lab"], active, work)
    assert ran.returncode == 0, ran.stderr[-3000:]
    out = json.loads(ran.stdout.strip().splitlines()[-1])
    visible, job = out["first"].split()
    assert visible and out["again"] == out["first"]  # the same GPU, the same job
    row = _row(program, common, int(job))
    assert (row["state"], row["time_limit"], row["user"]) == ("COMPLETED", 1200, alice.name)

    # submitit's plugin from the venv: a map_array of 10.
    sweep = _as(alice.name, [py, "-c", SWEEP, str(work / "runs")], active, work, timeout=600)
    assert sweep.returncode == 0, sweep.stderr[-3000:]
    assert json.loads(sweep.stdout.strip().splitlines()[-1])["results"] == [
        x * x for x in range(10)
    ]

    # --ddp under the venv's own Python, through the lab's gpuwarden.
    (work / "train.py").write_text(TRAIN)
    ddp = [program, "run", "-g", "2", "--time", "5m", "--ddp", "--", py, "train.py"]
    trained = _as(alice.name, ddp, active, work, timeout=600)
    assert trained.returncode == 0, trained.stdout[-2000:] + trained.stderr[-3000:]
    ranks = sorted(line for line in trained.stdout.splitlines() if line.startswith("rank "))
    assert [r.split()[1] for r in ranks] == ["0", "1"], trained.stdout
    assert all(str(venv) in r for r in ranks), ranks

    # `run -- bash -i` on the student's terminal (the venv's gpuwarden, as they type it):
    # Ctrl-Z stops the foreground command, `fg` resumes it.
    shell = [gw, "run", "-g", "1", "--time", "5m", "--", "bash", "--norc", "-i"]
    screen = login(alice, shell, {**active, "TERM": "dumb", "PS1": "prompt$ "}, str(work))
    try:
        suspend_and_resume(screen)
        screen.type(b"exit 7\n")
    finally:
        status = screen.close()
    assert status == 7, screen.seen[-2000:]
    return venv


def _upgraded(  # type: ignore[no-untyped-def]
    place: Path, alice, venv: Path, common: dict[str, str], old: str, new: str
) -> None:
    """The student's client after an upgrade of the service: one line, and the fix."""
    work = place / "work"
    env = {**common, "HOME": alice.home, "JUPYTER_PLATFORM_DIRS": "1", **_pip_settings()}
    active = {**env, "VIRTUAL_ENV": str(venv), "PATH": f"{venv}/bin:/usr/bin:/bin"}
    gw = str(venv / "bin" / "gpuwarden")
    told = _as(alice.name, [gw, "run", "--time", "1m", "--", "true"], active, work)
    assert told.returncode == 0, told.stderr
    said = [line for line in told.stderr.splitlines() if "the service" in line]
    assert said == [
        f"gpuwarden: this client ({venv}) is gpuwarden {old}, the service {new}: install "
        "the service's into it (`gpuwarden doctor` says how)"
    ], told.stderr
    doctor = _as(alice.name, [gw, "doctor"], active, work)
    line = re.search(FIX, doctor.stdout)
    assert line and line.group(0).endswith(f" gpuwarden=={new}"), doctor.stdout
    put = _as(alice.name, ["sh", "-c", line.group(0)], active, work)
    assert put.returncode == 0, put.stderr[-3000:]
    quiet = _as(alice.name, [gw, "run", "--time", "1m", "--", "true"], active, work)
    assert quiet.returncode == 0 and "the service" not in quiet.stderr, quiet.stderr


def _serve(program: str, lib: Path, common: dict[str, str], log: Path) -> subprocess.Popen[str]:
    """`gpuwarden serve` as the unit starts it (by hand: no systemd here), once it answers."""
    service = subprocess.Popen(
        [program, "serve", "--state-dir", str(lib / "service")],
        env={**common, "HOME": "/root", "GPUWARDEN_HEALTH_POLL_SECONDS": "1"},
        stdout=open(log, "a"),  # noqa: SIM115 - the process owns it
        stderr=subprocess.STDOUT,
        text=True,
    )

    def answers() -> bool:
        assert service.poll() is None, Path(log).read_text()[-3000:]
        with socket.socket(socket.AF_UNIX) as s:
            return s.connect_ex(common["GPUWARDEN_SOCKET"]) == 0

    wait_for(answers, 60, "the service answering on its socket")
    return service


def _pip_settings() -> dict[str, str]:
    """This machine's pip configuration (its index, find-links, constraints), as the
    student's pip gets it: where it is root's own (a user file or variables), `env -i`
    and another HOME would leave the student with none."""
    import sys

    listed = _run([sys.executable, "-m", "pip", "config", "list"], dict(os.environ))
    out: dict[str, str] = {}
    for line in listed.stdout.splitlines():
        key, _, value = line.partition("=")
        name = key.rsplit(".", 1)[-1]
        if value and name:
            out["PIP_" + name.upper().replace("-", "_")] = value.strip().strip("'\"")
    return out


def _row(program: str, env: dict[str, str], job: int) -> dict:  # type: ignore[type-arg]
    def ended() -> dict | None:  # type: ignore[type-arg]
        listed = _run([program, "jobs", "--all", "--json"], env)
        rows = [r for r in json.loads(listed.stdout or "[]") if r.get("id") == job]
        return rows[0] if rows else None

    return wait_for(ended, 60, f"job {job} in the history")


# The short submit alone (queueclient.thin): 99 where it steps aside for the full client.
THIN = """
import sys
from gpuwarden.queueclient.thin import submit
code = submit(sys.argv[1:])
sys.exit(99 if code is None else code)
"""


@pytest.mark.slow
@pytest.mark.timeout(1200)  # an install from the index and a venv, under load
def test_a_student_submits_from_her_own_venv_through_the_lab_install(place: Path) -> None:
    """`gpuwarden submit` from a student's venv (the wheels the lab keeps) against the
    lab's service under its `max_time` and group limits: the short client takes it, the
    job runs as her, and a refusal of the limits is the full client's line."""
    require(os.geteuid() == 0 and shutil.which("runuser") is not None, "needs root and runuser")
    require(os.access(SYSTEM_PY, os.X_OK), f"needs the system Python at {SYSTEM_PY}")
    require(shutil.which("git") is not None and (ROOT / ".git").exists(), "needs a git checkout")
    alice = make_user("alice", groups=("students",))
    clone = place / "clone"
    subprocess.run(["git", "clone", "--quiet", str(ROOT), str(clone)], check=True, timeout=120)
    prefix, bindir = place / "opt" / "gpuwarden", place / "bin"
    installer = [str(clone / "scripts" / "install-system"), "--prefix", str(prefix)]
    done = _run([*installer, "--bin", str(bindir)], dict(os.environ), timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    program, root = str(bindir / "gpuwarden"), place / "root"
    installed = _run([program, "service", "install", "--root", str(root)], {})
    assert installed.returncode == 0, installed.stdout + installed.stderr
    lib, conf = root / "var" / "lib" / "gpuwarden", root / "etc" / "gpuwarden" / "config.toml"
    conf.write_text(CONFIG)
    (place / "sim").mkdir(mode=0o755)
    common = {
        "PATH": "/usr/bin:/bin",
        "GPUWARDEN_SIM": SPEC,
        "GPUWARDEN_SIM_STATE": str(place / "sim"),
        "GPUWARDEN_SOCKET": str(root / "run" / "gpuwarden" / "gpuwarden.sock"),
        "GPUWARDEN_LEASE_DIR": str(lib / "leases"),
        "GPUWARDEN_STATE_DIR": str(lib / "state"),
        "GPUWARDEN_SYSTEM_CONFIG": str(conf),
    }
    service = _serve(program, lib, common, place / "serve.log")
    try:
        work = place / "work"
        work.mkdir(mode=0o755)
        os.chown(work, alice.uid, alice.gid)
        venv = work / "venv"
        env = {**common, "HOME": alice.home, **_pip_settings()}
        assert _as(alice.name, [SYSTEM_PY, "-m", "venv", str(venv)], env, work).returncode == 0
        py, gw = str(venv / "bin" / "python"), str(venv / "bin" / "gpuwarden")
        wheels = prefix / "share" / "gpuwarden" / "wheels"
        pip = [py, "-m", "pip", "install", "-q", "--no-index", "--find-links", str(wheels)]
        put = _as(alice.name, [*pip, "gpuwarden"], env, work)
        assert put.returncode == 0, put.stderr[-3000:]
        active = {**env, "VIRTUAL_ENV": str(venv), "PATH": f"{venv}/bin:/usr/bin:/bin"}
        thin = _as(alice.name, [py, "-c", THIN, "--time", "1m", "--", "id", "-un"], active, work)
        assert thin.returncode == 0, thin.stderr  # not 99: the short client took it
        row = _row(program, common, int(thin.stdout))
        assert (row["state"], row["user"]) == ("COMPLETED", alice.name), row
        assert (work / f"gpuwarden-{int(thin.stdout)}.out").read_text() == f"{alice.name}\n"
        typed = _as(
            alice.name, [gw, "submit", "--hold", "--time", "9m", "--", "true"], active, work
        )
        assert typed.returncode == 0 and typed.stdout.strip().isdigit(), typed.stderr
        # Over the students' 30 minutes: the same refusal by either client.
        over = ["--time", "2h", "--", "true"]
        short = _as(alice.name, [py, "-c", THIN, *over], active, work)
        whole = [py, "-c", "import sys; from gpuwarden.cli import main; sys.exit(main())"]
        full = _as(alice.name, [*whole, "submit", *over], active, work)
        assert short.returncode == full.returncode == 2, short.stderr + full.stderr
        assert short.stderr == full.stderr and short.stderr.startswith("gpuwarden submit: ")
    finally:
        service.send_signal(signal.SIGTERM)
        service.wait(60)
