"""gpuwarden against a real single-node Slurm (Debian's 22.05), started here by
scripts/slurm-ci under a temporary directory: the node's GPUs are character devices
made for it, as Slurm's own test suite fakes GPUs. Skips with the reason where Slurm
is missing (CI: fails; `.ci/run` installs it).

Clusters run on their own ports with their own config (clients find it through
SLURM_CONF), so none touches /etc/slurm, and each test asks for what it checks.
"""

from __future__ import annotations

import json
import os
import pwd
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from components import TORCH_MISSING, require, torch_found
from ports import free_port_pair
from repo import ROOT, SRC
from slurmtools import missing
from waiting import wait_for

SLURM_CI = ROOT / "scripts" / "slurm-ci"
EXAMPLE = ROOT / "examples" / "train.py"
USER = "gwslurmtest"


require(not missing(), missing() or "Slurm missing", module=True)


class Cluster:
    def __init__(self, path: Path, started: bool = False, **settings: str) -> None:
        self.path = path
        self.conf = str(path / "slurm.conf")
        self.out = path / "out"
        self.ours = not started
        if started:
            return
        env = dict(os.environ, SLURM_CI_PORT=str(free_port_pair()))
        env.update(settings)
        done = subprocess.run(
            [str(SLURM_CI), "start", str(path)], env=env, capture_output=True, text=True
        )
        if done.returncode != 0:
            self.stop()
            pytest.fail(f"slurm-ci start failed: {done.stdout}{done.stderr}", pytrace=False)

    def stop(self) -> None:
        if not self.ours:
            return
        subprocess.run([str(SLURM_CI), "stop", str(self.path)], capture_output=True)

    def env(self) -> dict[str, str]:
        return {"SLURM_CONF": self.conf}

    def tool(self, *argv: str) -> str:
        done = subprocess.run(
            argv, env=dict(os.environ, SLURM_CONF=self.conf), capture_output=True, text=True
        )
        assert done.returncode == 0, done.stderr
        return done.stdout

    def state(self, job: str) -> str:
        out = self.tool("scontrol", "show", "job", "-o", job)
        return out.split("JobState=", 1)[1].split()[0]

    def wait_for(self, job: str, states: tuple[str, ...], deadline: float = 90) -> str:
        state = ""

        def reached() -> str:
            nonlocal state
            state = self.state(job)
            return state if state in states else ""

        return wait_for(reached, deadline, lambda: f"job {job} still {state}, not {states}", 0.1)


@pytest.fixture(scope="module")
def clusters() -> Iterator[Callable[..., Cluster]]:
    """`clusters(name, **settings)`: a started cluster (slurm-ci settings), one per name."""
    made: dict[str, Cluster] = {}
    top = Path(tempfile.mkdtemp(prefix="gw-slurm-"))
    top.chmod(0o755)  # jobs of a non-root user read the config and write output here

    def get(name: str, **settings: str) -> Cluster:
        shared = os.environ.get("GPUWARDEN_TEST_SLURM_CONF")
        if name == "plain" and shared and name not in made:
            made[name] = Cluster(Path(shared).parent, started=True)  # .ci/run's
        if name not in made:
            made[name] = Cluster(top / name, **settings)
        return made[name]

    yield get
    for cluster in made.values():
        cluster.stop()
    shutil.rmtree(top, ignore_errors=True)


@pytest.fixture
def slurm(clusters: Callable[..., Cluster], monkeypatch: pytest.MonkeyPatch) -> Cluster:
    """The plain cluster (.ci/run's when it exported GPUWARDEN_TEST_SLURM_CONF): 4 fake
    GPUs, 8 declared CPUs; SLURM_CONF set for this test."""
    cluster = clusters("plain")
    monkeypatch.setenv("SLURM_CONF", cluster.conf)
    return cluster


def _submit(cli: Any, *argv: str, cwd: Any = None) -> str:
    done = cli("submit", "--slurm", *argv, cwd=cwd)
    assert done.returncode == 0, done.stderr
    job = done.stdout.strip()
    assert job.isdigit(), done.stdout
    return job


def test_two_jobs_get_disjoint_gpus_a_third_waits_for_resources_and_cancel_ends_it(
    cli: Any, slurm: Cluster, tmp_path: Path
) -> None:
    hold = "echo CVD=$CUDA_VISIBLE_DEVICES; sleep 300"
    a = _submit(cli, "-g", "2", "--output", "a.out", "--", "sh", "-c", hold)
    b = _submit(cli, "-g", "2", "--output", "b.out", "--", "sh", "-c", hold)
    c = _submit(cli, "-g", "2", "--name", "third", "--", "sh", "-c", hold)
    try:
        outs = [Path("a.out"), Path("b.out")]
        wait_for(lambda: all(p.exists() and "CVD=" in p.read_text() for p in outs), 60, "both jobs")
        seen = [set(p.read_text().split("CVD=")[1].split()[0].split(",")) for p in outs]
        assert len(seen[0]) == len(seen[1]) == 2
        assert not seen[0] & seen[1], seen

        def third_line() -> str:
            done = cli("queue", "--slurm")
            assert done.returncode == 0, done.stderr
            line = next(x for x in done.stdout.splitlines() if x.split()[0] == c)
            return line if "pending (Resources)" in line else ""

        line = wait_for(third_line, 60, "the third job pending for Resources")
        assert line.split()[-1] == "third" and "gpu:2" in line
        done = cli("cancel", "--slurm", c)
        assert done.returncode == 0, done.stderr
        assert slurm.wait_for(c, ("CANCELLED",)) == "CANCELLED"
        again = cli("cancel", "--slurm", c)
        assert again.returncode == 2
        assert f"no Slurm job {c} is pending or running" in again.stderr
    finally:
        slurm.tool("scancel", a, b, c)


def test_a_job_submitted_by_a_real_user_runs_as_that_user(cli: Any, slurm: Cluster) -> None:
    made = False
    try:
        pwd.getpwnam(USER)
    except KeyError:
        subprocess.run(["useradd", "--system", "--no-create-home", USER], check=True)
        made = True
    try:
        _as_a_user(cli, slurm)
    finally:
        if made:
            subprocess.run(["userdel", USER], capture_output=True)


def _as_a_user(cli: Any, slurm: Cluster) -> None:
    # A copy of the sources the user can read (the checkout may sit in root's home).
    src = Path(tempfile.mkdtemp(prefix="gw-src-"))
    src.chmod(0o755)
    shutil.copytree(SRC / "gpuwarden", src / "gpuwarden", ignore=shutil.ignore_patterns("*.pyc"))
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": "/nonexistent",
        "PYTHONPATH": str(src),
        "SLURM_CONF": slurm.conf,
    }
    argv = ["runuser", "-u", USER, "--", "env", "-i"]
    argv += [f"{k}={v}" for k, v in env.items()]
    # The system's python: a venv's may link into root's home, which the user cannot enter;
    # `submit` needs only the standard library.
    python = shutil.which("python3", path="/usr/bin:/bin") or sys.executable
    argv += [python, "-m", "gpuwarden", "submit", "--slurm", "-g", "0"]
    argv += ["--output", "user-%j.out", "--", "sh", "-c", "id -un; echo $SLURM_JOB_USER"]
    try:
        done = subprocess.run(argv, cwd=slurm.out, capture_output=True, text=True, timeout=60)
    finally:
        shutil.rmtree(src, ignore_errors=True)
    assert done.returncode == 0, done.stderr
    job = done.stdout.strip()
    assert slurm.wait_for(job, ("COMPLETED", "FAILED")) == "COMPLETED"
    out = slurm.out / f"user-{job}.out"
    assert out.read_text().split() == [USER, USER]
    assert out.stat().st_uid == pwd.getpwnam(USER).pw_uid
    # and `gpuwarden queue`/`logs` see it as that user's
    logs = cli("logs", "--slurm", job)
    assert logs.returncode == 0, logs.stderr
    assert logs.stdout.split() == [USER, USER]


def test_logs_follow_a_job_to_its_end(cli: Any, slurm: Cluster) -> None:
    job = _submit(cli, "-g", "1", "--", "sh", "-c", "echo one; sleep 1; echo two")
    done = cli("logs", "--slurm", "-f", job, timeout=90)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["one", "two"]
    assert slurm.state(job) == "COMPLETED"


def test_an_array_becomes_sbatchs_own(cli: Any, slurm: Cluster, tmp_path: Path) -> None:
    """`submit --slurm --array` is sbatch's --array: Slurm runs each task with its id."""
    task = "echo task=$SLURM_ARRAY_TASK_ID of $SLURM_ARRAY_JOB_ID"
    array = _submit(
        cli, "-g", "0", "--array", "0-2%1", "--output", str(tmp_path / "a-%A_%a.out"), "--",
        "sh", "-c", task,
    )  # fmt: skip
    outs = [tmp_path / f"a-{array}_{i}.out" for i in range(3)]
    wait_for(lambda: all(p.exists() and "task=" in p.read_text() for p in outs), 60, "three tasks")
    assert [p.read_text().split() for p in outs] == [[f"task={i}", "of", array] for i in range(3)]


def test_signal_before_the_limit_reaches_the_command(
    cli: Any, slurm: Cluster, tmp_path: Path
) -> None:
    """`submit --slurm --time 2 --signal USR1@110`: Slurm itself sends USR1 to the command
    (the batch script exec's it, so `B:` is what reaches it) about 10 s into the job,
    never the time limit's SIGTERM (Slurm may send it up to 60 s early)."""
    out = tmp_path / "signal.out"
    script = "trap 'echo got USR1; exit 0' USR1; echo started; while :; do sleep 1; done"
    job = _submit(
        cli, "-g", "0", "--time", "2", "--signal", "USR1@110", "--output", str(out), "--",
        "sh", "-c", script,
    )  # fmt: skip
    wait_for(lambda: out.exists() and "got USR1" in out.read_text(), 60, "USR1 from Slurm")
    assert out.read_text().split() == ["started", "got", "USR1"]
    assert slurm.wait_for(job, ("COMPLETED",)) == "COMPLETED"


def test_run_slurm_is_attached_through_srun(cli: Any, slurm: Cluster) -> None:
    done = cli("run", "--slurm", "-g", "1", "--", "sh", "-c", "echo $CUDA_VISIBLE_DEVICES; exit 3")
    assert done.returncode == 3, done.stderr
    assert done.stdout.strip() in {"0", "1", "2", "3"}


def test_slurm_errors_are_one_line_with_slurms_text(
    cli: Any, slurm: Cluster, tmp_path: Path
) -> None:
    cases = [
        (("-g", "9", "--", "true"), "sbatch failed: Batch job submission failed: Requested node"),
        (("--time", "1:2:3:4", "--", "true"), "invalid --time '1:2:3:4'"),
    ]
    for argv, text in cases:
        done = cli("submit", "--slurm", *argv)
        assert done.returncode == 2 and text in done.stderr, done.stderr
        assert len(done.stderr.strip().splitlines()) == 1
    # a typed gres the site configured but this cluster lacks: Slurm says so
    conf = tmp_path / "etc" / "config.toml"
    conf.parent.mkdir()
    conf.write_text('[slurm]\ngpu_types = ["h100"]\n')
    dry = cli("submit", "--slurm", "--model", "H100", "--dry-run", "--", "true")
    assert "#SBATCH --gres=gpu:h100:1" in dry.stdout, dry.stderr
    done = cli("submit", "--slurm", "--model", "H100", "--", "true")
    assert done.returncode == 2
    assert done.stderr.strip() == (
        "gpuwarden submit: sbatch failed: Batch job submission failed: Requested node "
        "configuration is not available"
    )
    # the controller down: a config naming a port nobody serves
    down = tmp_path / "down.conf"
    text = Path(slurm.conf).read_text()
    port = text.split("SlurmctldPort=")[1].split()[0]
    dead = str(free_port_pair())
    down.write_text(
        text.replace(f"SlurmctldPort={port}", f"SlurmctldPort={dead}") + "MessageTimeout=2\n"
    )
    for argv in (("queue", "--slurm"), ("submit", "--slurm", "--", "true")):
        done = cli(*argv, env={"SLURM_CONF": str(down)})
        assert done.returncode == 2
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1 and "Unable to contact slurm controller" in lines[0], lines


def test_ddp_job_initialised_from_slurms_variables_matches_run_ddp(
    cli: Any, slurm: Cluster
) -> None:
    require(torch_found(), TORCH_MISSING)
    import torch

    args = ("--steps", "20", "--threads", "1", "--micro-batch", "8")
    env = {"OMP_NUM_THREADS": "1"}
    job = _submit(
        cli, "--ddp", "-g", "2", "--output", "ddp.log", "--", str(EXAMPLE), *args, "--out", "s.pt"
    )
    local = cli(
        "run",
        "--ddp",
        "--nproc",
        "2",
        "--",
        str(EXAMPLE),
        *args,
        "--out",
        "r.pt",
        env=env,
        timeout=120,
    )
    assert local.returncode == 0, local.stderr
    assert slurm.wait_for(job, ("COMPLETED", "FAILED", "CANCELLED")) == "COMPLETED", Path(
        "ddp.log"
    ).read_text()
    log = Path("ddp.log").read_text()
    assert "backend=gloo world=2 env=slurm" in log, log
    final = [x for x in log.splitlines() if x.startswith("done:")]
    assert len(final) == 1  # rank 0 only
    mine = [x for x in local.stdout.splitlines() if x.startswith("done:")]
    assert final[0].split(",")[:2] == mine[0].split(",")[:2]  # steps and final loss
    a, b = torch.load("s.pt"), torch.load("r.pt")
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=1e-4, atol=1e-5)


EIGHT = """
description = "8 idle A100 for the Slurm prolog tests"
driver_version = "550.54.15"
cuda_version = "12.4"
""" + "".join(
    f'[[gpu]]\nmodel = "A100-SXM4-80GB"\npci_bus_id = "00000000:{bus}:00.0"\n'
    for bus in ("07", "0B", "48", "4C", "88", "8B", "C8", "CB")
)


ECHO_CVD = ("sh", "-c", "echo $CUDA_VISIBLE_DEVICES")


class Node:
    """The cluster with gpuwarden's prolog and epilog on a simulated 8-GPU machine: its
    leases, drains and the wrappers' log live under `top`; `local` is the environment
    that makes a process see the same machine."""

    def __init__(self, top: Path, cluster: Cluster, local: dict[str, str]) -> None:
        self.top = top
        self.cluster = cluster
        self.local = local

    def log(self, action: str) -> str:
        return (self.top / f"{action}.log").read_text()


def _wrappers(top: Path, local: dict[str, str]) -> dict[str, str]:
    """slurmd runs Prolog=/Epilog= with an environment of its own: each wrapper says
    where gpuwarden, the (simulated) machine, the leases and drains are. slurm-ci's
    settings for them."""
    for action in ("prolog", "epilog", "task-prolog"):
        script = top / f"{action}.sh"
        exports = " ".join(f"{k}={v}" for k, v in local.items())
        # the task prolog's stdout is what slurmd reads (`export NAME=VALUE`)
        log = f">>{top}/{action}.log" if action != "task-prolog" else ""
        script.write_text(
            f"#!/bin/sh\nexport {exports} PYTHONPATH={SRC} PATH=$PATH:/usr/bin:/bin\n"
            f"exec {sys.executable} -m gpuwarden slurm {action} {log} 2>>{top}/{action}.log\n"
        )
        script.chmod(0o755)
    return {
        "SLURM_CI_PROLOG": str(top / "prolog.sh"),
        "SLURM_CI_EPILOG": str(top / "epilog.sh"),
        "SLURM_CI_TASK_PROLOG": str(top / "task-prolog.sh"),
    }


@pytest.fixture(scope="module")
def prolog_node(clusters: Callable[..., Cluster]) -> Iterator[Node]:
    """One cluster for every prolog test (a start-up is seconds): 8 fake GPUs, 16 CPUs."""
    top = Path(tempfile.mkdtemp(prefix="gw-prolog-"))
    top.chmod(0o755)
    try:
        (top / "eight.toml").write_text(EIGHT)
        (top / "leases").mkdir(mode=0o700)
        local = {
            "GPUWARDEN_SIM": str(top / "eight.toml"),
            "GPUWARDEN_SIM_STATE": str(top / "sim"),
            "GPUWARDEN_LEASE_DIR": str(top / "leases"),
            "GPUWARDEN_STATE_DIR": str(top / "state"),
            "GPUWARDEN_SYSTEM_CONFIG": str(top / "none.toml"),
        }
        _wrappers(top, local)
        cluster = clusters(
            "prolog",
            SLURM_CI_GPUS="8",
            SLURM_CI_CPUS="16",
            **_wrappers(top, local),
        )
        yield Node(top, cluster, {**local, "SLURM_CONF": cluster.conf})
    finally:
        shutil.rmtree(top, ignore_errors=True)


@pytest.fixture
def node(prolog_node: Node, monkeypatch: pytest.MonkeyPatch) -> Iterator[Node]:
    for k, v in prolog_node.local.items():
        monkeypatch.setenv(k, v)
    yield prolog_node
    # the next test starts from an idle node
    jobs = prolog_node.cluster.tool("squeue", "-h", "-o", "%i").split()
    if jobs:
        subprocess.run(["scancel", *jobs], env=dict(os.environ), capture_output=True)
    wait_for(
        lambda: not prolog_node.cluster.tool("squeue", "-h", "-o", "%i").split(), 60, "an idle node"
    )


def _queue_line(cli: Any, job: str) -> str:
    done = cli("queue", "--slurm")
    assert done.returncode == 0, done.stderr
    return next((x for x in done.stdout.splitlines() if x.split()[0] == job), "")


def _leases(node: Node) -> list[Any]:
    from gpuwarden.leases import list_leases

    return list_leases(str(node.top / "leases"))


def test_one_queue_slurm_and_local_runs_never_share_and_the_first_in_line_goes_first(
    cli: Any, node: Node, tmp_path: Path
) -> None:
    """A Slurm job holds 2 GPUs; a local `run -g 8 --wait` joins the line; a Slurm job
    allocated after it waits in its prolog (and `queue --slurm` says so) until the local
    run has had all 8: the later Slurm job does not overtake it."""
    flag = tmp_path / "go"
    job = _submit(cli, "-g", "2", "--", "sh", "-c", f"while [ ! -e {flag} ]; do sleep 0.1; done")
    node.cluster.wait_for(job, ("RUNNING",))

    # (the prolog publishes one GPU's metadata after the other: poll for both)
    def both() -> list[Any]:
        got = [i for i in _leases(node) if i.job == f"slurm-{job}"]
        return got if len(got) == 2 else []

    held = wait_for(both, 60, "the prolog's two leases")
    assert {i.job for i in held} == {f"slurm-{job}"}
    waiting = subprocess.Popen(
        [sys.executable, "-m", "gpuwarden", "run", "-g", "8", "--wait", "--", *ECHO_CVD],
        env=dict(os.environ, PYTHONPATH=str(SRC)),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        # it waits in line (its ticket appears) while the job holds 2 of the 8
        leases = node.top / "leases"
        wait_for(lambda: any(n.endswith(".wait") for n in os.listdir(leases)), 60, "a waiter")
        later = _submit(cli, "-g", "1", "--output", "later.out", "--", "sh", "-c", "echo ran")
        line = wait_for(
            lambda: "starting (Prolog:" in (x := _queue_line(cli, later)) and x,
            60,
            "later's prolog",
        )
        assert "`gpuwarden run --wait` is first in line" in line, line
        assert not Path("later.out").exists()  # nothing of it ran
        assert waiting.poll() is None
        flag.touch()
        out, err = waiting.communicate(timeout=90)
    finally:
        if waiting.poll() is None:
            waiting.kill()
    assert waiting.returncode == 0, err
    assert out.strip() == "0,1,2,3,4,5,6,7"  # all 8: the later Slurm job did not overtake
    assert "waiting for 8 GPUs" in err
    # the GPUs came free during the epilog, while the job may still be completing
    assert node.cluster.wait_for(job, ("COMPLETED", "FAILED")) == "COMPLETED"
    assert node.cluster.wait_for(later, ("COMPLETED", "FAILED")) == "COMPLETED"
    assert Path("later.out").read_text().split() == ["ran"]
    assert "leased GPU" in node.log("prolog") and "released GPU" in node.log("epilog")
    assert _queue_line(cli, later).split()[2] == "done"  # ended jobs stay listed (-t all)


def test_a_drained_gpu_gets_no_slurm_job_while_the_other_seven_run(
    cli: Any, node: Node, tmp_path: Path
) -> None:
    flag = tmp_path / "go"
    done = cli("drain", "3", "--reason", "XID 79 in a test")
    assert done.returncode == 0, done.stderr
    hold = f"echo $SLURM_JOB_GPUS; while [ ! -e {flag} ]; do sleep 0.1; done"
    jobs = [
        _submit(cli, "-g", "1", "--output", "d-%j.out", "--", "sh", "-c", hold) for _ in range(8)
    ]
    ninth = _submit(cli, "-g", "1", "--output", "d-%j.out", "--", "sh", "-c", hold)
    try:
        outs = {j: Path(f"d-{j}.out") for j in [*jobs, ninth]}

        def ran() -> dict[str, str]:
            got = {j: p.read_text().strip() for j, p in outs.items() if p.exists()}
            return got if len(got) == 7 and all(got.values()) else {}

        gpus = wait_for(ran, 60, "seven jobs running")
        assert sorted(gpus.values()) == ["0", "1", "2", "4", "5", "6", "7"]
        (held,) = set(jobs) - set(gpus)  # (the ninth waits for Resources)
        # (Slurm says "starting (Prolog)" first, the prolog's note follows)
        note = "starting (Prolog: GPU 3 is drained (XID 79 in a test))"
        wait_for(lambda: note in _queue_line(cli, held), 60, "the eighth job held")
        assert not outs[held].exists()  # nothing of it ran
        assert node.cluster.tool("sinfo", "-h", "-N", "-o", "%T").split() == ["mixed"]
        assert {i.index for i in _leases(node)} == {0, 1, 2, 4, 5, 6, 7}
        # a drain of a GPU a running job holds: the job is reported, not stopped
        on5 = next(j for j, g in gpus.items() if g == "5")
        done = cli("drain", "5", "--reason", "fan")
        assert done.returncode == 0, done.stderr
        assert f"GPU 5: Slurm job {on5} keeps running on it until it ends" in done.stdout
        line = wait_for(
            lambda: "on drained GPU 5" in (x := _queue_line(cli, on5)) and x, 60, "report"
        )
        assert line.split()[2] == "running"
        # the held job cancelled: its prolog sees it gone and leaves; the ninth, pending
        # until now, is given GPU 3 and held in turn
        assert "pending (Resources)" in _queue_line(cli, ninth)
        node.cluster.tool("scancel", held)
        wait_for(lambda: note in _queue_line(cli, ninth), 60, "the ninth job held")
        assert not outs[held].exists()
        assert "ended while its prolog waited" in node.log("prolog")
        # undrain gives GPU 3 back: the held job runs there
        assert cli("undrain", "3").returncode == 0
        wait_for(
            lambda: outs[ninth].exists() and outs[ninth].read_text().strip() == "3", 60, "GPU 3"
        )
        assert "waits: GPU 3 is drained" in node.log("prolog")
    finally:
        flag.touch()
        cli("undrain", "3", "5")


def test_slurm_conf_of_the_simulated_server_is_accepted_by_slurmd(
    cli: Any, clusters: Callable[..., Cluster], sim: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    sim("server-8xa100")
    top = Path(tempfile.mkdtemp(prefix="gw-gres-"))
    try:
        dev = top / "dev"
        dev.mkdir()
        for i in range(8):  # what /dev/nvidia0..7 are on a GPU machine: char 195, i
            os.mknod(dev / f"nvidia{i}", 0o666 | 0o020000, os.makedev(195, i))
        gres = cli("slurm", "conf", "--section", "gres", "--dev-dir", str(dev))
        node = cli("slurm", "conf", "--section", "node")
        assert gres.returncode == 0 and node.returncode == 0, gres.stderr + node.stderr
        assert gres.stdout.count(f"File={dev}/nvidia") == 8 and "Links=-1,12," in gres.stdout
        (top / "gres.conf").write_text(gres.stdout)
        cluster = clusters(
            "gres",
            SLURM_CI_GRES_CONF=str(top / "gres.conf"),
            SLURM_CI_NODE_LINE=node.stdout.strip() + " State=UNKNOWN",
        )
        line = cluster.tool("sinfo", "-h", "-N", "-o", "%T %G")
        assert line.split() == ["idle", "gpu:8"]
        # and the health watch's drain, when configured, takes the node out of service
        from gpuwarden.slurm import node as slurm_node

        monkeypatch.setenv("SLURM_CONF", cluster.conf)
        conf = {"slurm.drain_node": True, "slurm.node": None}
        drained = slurm_node.drain_for_fault(conf, "3", "XID 79 (fallen off the bus)")
        state = cluster.tool("sinfo", "-h", "-N", "-n", drained, "-o", "%T|%E").strip()
        assert state == "drained|gpuwarden: GPU 3: XID 79 (fallen off the bus)"
    finally:
        shutil.rmtree(top, ignore_errors=True)


def test_a_failed_submitit_jobs_traceback_is_in_logs_and_jobs_lists_it(
    cli: Any, slurm: Cluster, tmp_path: Path
) -> None:
    """submitit writes a job's stdout and stderr to two files; its traceback goes to the
    second, which `logs --slurm` shows too. The ended job stays in `queue --slurm` and is
    in `jobs --slurm` (the controller's memory: this cluster runs no slurmdbd)."""
    submitit = pytest.importorskip("submitit", reason="submitit missing (the test group has it)")
    executor = submitit.SlurmExecutor(folder=tmp_path / "sub", python=sys.executable)
    executor.update_parameters(time=5, gres="gpu:1")
    job = executor.submit(int, "not a number")  # ValueError in the job
    assert slurm.wait_for(job.job_id, ("FAILED", "COMPLETED")) == "FAILED"
    done = cli("logs", "--slurm", job.job_id)
    assert done.returncode == 0, done.stderr
    assert "ValueError: invalid literal for int() with base 10: 'not a number'" in done.stderr
    assert "Traceback (most recent call last)" in done.stderr
    assert "Starting with JobEnvironment" in done.stdout + done.stderr  # submitit's own log
    line = _queue_line(cli, job.job_id)
    assert line.split()[2] == "failed", line
    jobs = cli("jobs", "--slurm", "--json")
    assert jobs.returncode == 0, jobs.stderr
    (mine,) = [j for j in json.loads(jobs.stdout) if j["id"] == job.job_id]
    assert (mine["state"], mine["exit_code"], mine["count"]) == ("failed", 1, 1)
    table = cli("jobs", "--slurm")
    row = next(x for x in table.stdout.splitlines() if x.split()[0] == job.job_id)
    assert "failed" in row and "exit 1" in row


def test_mig_gres_lines_are_accepted_and_the_prolog_leases_the_slice(
    cli: Any, clusters: Callable[..., Cluster], sim: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`slurm conf` on the simulated `mixed` machine (an A100 split into 3g.40gb, 2g.20gb
    and two 1g.10gb): slurmd accepts the MIG lines (stand-in device files, as for whole
    GPUs) and the node offers each slice by its type; a job asking for a 1g.10gb slice
    gets one, and the prolog leases exactly that MIG device."""
    sim("mixed")
    top = Path(tempfile.mkdtemp(prefix="gw-mig-"))
    top.chmod(0o755)
    try:
        dev = top / "dev"
        (dev / "nvidia-caps").mkdir(parents=True)
        for i in range(4):
            os.mknod(dev / f"nvidia{i}", 0o666 | 0o020000, os.makedev(195, i))
        gres = cli("slurm", "conf", "--section", "gres", "--dev-dir", str(dev))
        node = cli("slurm", "conf", "--section", "node")
        assert gres.returncode == 0 and node.returncode == 0, gres.stderr + node.stderr
        lines = [x for x in gres.stdout.splitlines() if x.startswith("Name=gpu")]
        assert [("MultipleFiles=" in x) for x in lines] == [False] * 3 + [True] * 4
        for word in " ".join(lines).replace(",", " ").split():  # the slices' caps devices
            name = word.rpartition("/")[2]
            if name.startswith("nvidia-cap"):
                minor = int(name[len("nvidia-cap") :])
                os.mknod(dev / "nvidia-caps" / name, 0o666 | 0o020000, os.makedev(235, minor))
        (top / "gres.conf").write_text(gres.stdout)
        (top / "leases").mkdir(mode=0o700)
        local = {
            "GPUWARDEN_SIM": os.environ["GPUWARDEN_SIM"],
            "GPUWARDEN_SIM_STATE": str(top / "sim"),
            "GPUWARDEN_LEASE_DIR": str(top / "leases"),
            "GPUWARDEN_STATE_DIR": str(top / "state"),
            "GPUWARDEN_SYSTEM_CONFIG": str(top / "none.toml"),
        }
        words = [w for w in node.stdout.split() if not w.startswith("CPUs=")]
        cluster = clusters(
            "mig",
            SLURM_CI_GRES_CONF=str(top / "gres.conf"),
            SLURM_CI_NODE_LINE=" ".join([*words, "CPUs=8", "State=UNKNOWN"]),
            **_wrappers(top, local),
        )
        state, offered = cluster.tool("sinfo", "-h", "-N", "-o", "%T %G").split()
        assert state == "idle"
        assert sorted(offered.split(",")) == sorted(
            [
                "gpu:t4:1",
                "gpu:v100:1",
                "gpu:rtx_a6000:1",
                "gpu:a100_3g.40gb:1",
                "gpu:a100_2g.20gb:1",
                "gpu:a100_1g.10gb:2",
            ]
        )
        for k, v in {**local, "SLURM_CONF": cluster.conf}.items():
            monkeypatch.setenv(k, v)
        out = cluster.out / "mig.out"
        argv = ["sbatch", "--parsable", "--gres=gpu:a100_1g.10gb:1", f"--output={out}"]
        script = "echo $SLURM_JOB_GPUS; srun sh -c 'echo $CUDA_VISIBLE_DEVICES'; sleep 2"
        job = cluster.tool(*argv, "--wrap", f"echo $CUDA_VISIBLE_DEVICES; {script}").strip()
        cluster.wait_for(job, ("RUNNING", "COMPLETED"))
        from gpuwarden.leases import list_leases

        (lease,) = wait_for(lambda: list_leases(str(top / "leases")), 60, "the slice's lease")
        assert lease.job == f"slurm-{job}" and lease.uuid.startswith("MIG-") and lease.index == 3
        from gpuwarden.machine.inventory import read_snapshot

        slice_ = next(
            m
            for g in read_snapshot(processes=False).gpus
            for m in g.mig_instances
            if m.uuid == lease.uuid
        )
        assert slice_.name == "1g.10gb"
        assert cluster.wait_for(job, ("COMPLETED", "FAILED")) == "COMPLETED"
        # The job's script and its srun step see the slice's UUID, which CUDA opens (Slurm
        # itself sets the position in gres.conf, 5 or 6, where CUDA finds no device).
        batch, position, step = out.read_text().split()
        assert position in ("5", "6")  # gres.conf positions of the 1g slices
        assert batch == step == lease.uuid, out.read_text()
        wait_for(
            lambda: not list_leases(str(top / "leases")), 60, "the epilog's release of the slice"
        )
    finally:
        shutil.rmtree(top, ignore_errors=True)


def test_report_slurm_counts_slurms_jobs_in_the_local_reports_columns(
    cli: Any, slurm: Cluster
) -> None:
    """`report --slurm` reads this Slurm (sacct where it keeps accounting, else the
    controller's memory, which it says) into the columns `report` gives locally."""
    import csv
    import io

    job = _submit(cli, "-g", "2", "--", "sleep", "3")
    assert slurm.wait_for(job, ("COMPLETED", "FAILED")) == "COMPLETED"
    shown = slurm.tool("scontrol", "show", "job", "-o", job)
    ran = shown.split("RunTime=", 1)[1].split()[0]
    seconds = sum(int(p) * 60**i for i, p in enumerate(reversed(ran.split(":"))))
    done = cli("report", "--slurm", "--by", "job", "--format", "csv", "--since", "1h")
    assert done.returncode == 0, done.stderr
    rows = {r["job"]: r for r in csv.DictReader(io.StringIO(done.stdout))}
    assert job in rows, (done.stdout, done.stderr)
    assert float(rows[job]["gpu_hours"]) == pytest.approx(2 * seconds / 3600, rel=0.05, abs=1e-3)
    assert rows[job]["jobs"] == "1" and float(rows[job]["mean_wait_s"]) >= 0
    by_user = cli("report", "--slurm", "--format", "json", "--since", "1h")
    assert by_user.returncode == 0, by_user.stderr
    assert "root" in {r["name"] for r in json.loads(by_user.stdout)}
