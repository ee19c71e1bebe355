"""`gpuwarden slurm cluster` makes a Slurm cluster that really runs: two nodes, each a
network namespace with its own address, hostname, sshd and simulated 2-GPU machine
(tests/netns.py), whose facts a real user collects over ssh; slurmctld here and a
slurmd in each namespace (`slurmd -N`) are then started from the written files alone
(only their paths chosen by the command's options), with accounting as written by
default: slurmdbd here, on a MariaDB of the test's own (tests/mariadb.py), set up as
the README says. A 2-GPU job runs on each node under gpuwarden's prolog lease and
`sacct` lists both; a job wider than any node is refused by sbatch itself; a job can
open only its own GPU's device file (cgroup.conf's ConstrainDevices).
"""

from __future__ import annotations

import contextlib
import csv
import io
import json
import os
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import mariadb
import netns
from components import require
from ports import free_port_run
from repo import ROOT
from slurmtools import missing
from waiting import wait_for

require(not netns.missing(), netns.missing() or "no namespaces", module=True)
require(not missing(), missing() or "Slurm missing", module=True)
require(not mariadb.missing(), mariadb.missing() or "MariaDB missing", module=True)
require(
    shutil.which("slurmdbd") is not None or os.path.exists("/usr/sbin/slurmdbd"),
    "slurmdbd is not installed (Debian: slurmdbd)",
    module=True,
)
PASSWORD = "gw-test-" + os.urandom(6).hex()

TWO = """
description = "2 idle A100 for a Slurm node"
driver_version = "550.54.15"
cuda_version = "12.4"
""" + "".join(
    f'[[gpu]]\nmodel = "A100-SXM4-80GB"\npci_bus_id = "00000000:{bus}:00.0"\n'
    for bus in ("07", "0B")
)


class Cluster:
    def __init__(self, top: Path, lab: netns.SshLab) -> None:
        self.top, self.lab = top, lab
        self.conf = top / "conf"
        self.env = dict(os.environ, SLURM_CONF=str(self.conf / "slurm.conf"))
        self.db = mariadb.MariaDB(top)
        self.dbd: subprocess.Popen[bytes] | None = None

    def tool(self, *argv: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(argv, env=self.env, capture_output=True, text=True, timeout=60)

    def wait(self, what: str, check: Any, deadline: float = 60) -> Any:
        def said() -> str:
            logs = "".join(p.read_text()[-1500:] for p in (self.top / "state").glob("*.log"))
            return f"{what}\n{logs}"

        return wait_for(check, deadline, said, 0.1)

    def state(self, job: str) -> str:
        out = self.tool("scontrol", "show", "job", "-o", job).stdout
        return out.split("JobState=", 1)[1].split()[0] if "JobState=" in out else ""


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    top = Path(tempfile.mkdtemp(prefix="gw-slurmcluster-"))
    top.chmod(0o755)
    (top / "two.toml").write_text(TWO)
    lab = netns.ssh_lab(top, {"node1": str(top / "two.toml"), "node2": str(top / "two.toml")})
    made = Cluster(top, lab)
    try:
        _configure(made)
        _start(made)
        yield made
    finally:
        pid = top / "state" / "slurmctld.pid"
        if pid.exists():
            made.tool("scancel", "--full", "-u", "root")
        lab.close()  # every slurmd, sshd and job in the namespaces
        try:
            if pid.exists():
                subprocess.run(["kill", pid.read_text().strip()], capture_output=True)
                made.wait("slurmctld gone after its SIGTERM", lambda: not _running(pid), 15)
        finally:
            if made.dbd is not None:
                made.dbd.terminate()
                made.dbd.wait(timeout=30)
            made.db.stop()
            _remove_slurm_cgroups()
            shutil.rmtree(top, ignore_errors=True)


def _running(pidfile: Path) -> bool:
    """Whether the process its pid file names still runs (a removed file: it does not)."""
    return subprocess.run(["pgrep", "-F", str(pidfile)], capture_output=True).returncode == 0


def _remove_slurm_cgroups() -> None:
    """The cgroups the nodes' slurmd made (`slurm_NODE` under each controller), deepest
    first once their processes are gone: the kernel refuses one still in use."""
    for top in Path("/sys/fs/cgroup").glob("*/slurm_node[12]"):
        for inner, _, _ in os.walk(top, topdown=False):
            with contextlib.suppress(OSError):
                os.rmdir(inner)


def _configure(c: Cluster) -> None:
    """Fake GPU device files, each node's site settings for the hooks, then the command."""
    dev = c.top / "dev"
    dev.mkdir()
    for i in range(2):
        os.mknod(dev / f"nvidia{i}", 0o666 | 0o020000, os.makedev(195, i))
    (c.top / "env").mkdir()
    (c.top / "out").mkdir()  # the jobs' output
    for name in ("node1", "node2"):
        state = c.top / name
        settings = {
            "GPUWARDEN_SIM": str(c.top / "two.toml"),
            "GPUWARDEN_SIM_STATE": str(state / "sim"),
            "GPUWARDEN_LEASE_DIR": str(state / "leases"),
            "GPUWARDEN_STATE_DIR": str(state / "state"),
            "GPUWARDEN_SYSTEM_CONFIG": str(c.top / "none.toml"),
            "PYTHONPATH": c.lab.path,
        }
        (c.top / "env" / name).write_text("".join(f"{k}={v}\n" for k, v in settings.items()))
    c.conf.mkdir()
    os.chown(c.conf, *_ids(c.lab.user))
    port = free_port_run(3)  # slurmctld, slurmd, slurmdbd
    controller = f"{socket.gethostname().split('.')[0]}={c.lab.hosts['node1'].peer}"
    done = c.lab.cli(
        *("slurm", "cluster", "node1", "node2", "--out", str(c.conf), "--name", "gwtest"),
        *("--controller", controller, "--state-dir", str(c.top / "state")),
        *("--conf-dir", str(c.conf), "--slurm-user", "root", "--port", str(port)),
        *("--dev-dir", str(dev), "--hook-env", f"{c.top}/env/%n"),
        *("--cgroup", _cgroup_version()),
    )
    assert done.returncode == 0, done.stderr
    written = [Path(x).name for x in done.stdout.splitlines() if not x.startswith("next:")]
    assert sorted(written) == sorted(
        [
            *("slurm.conf", "gres.conf", "cgroup.conf", "README"),
            *("prolog.sh", "epilog.sh", "task-prolog.sh", "slurmdbd.conf"),
        ]
    )


def _cgroup_version() -> str:
    """What this machine runs: v2 where /sys/fs/cgroup is cgroup2, else v1 (a hybrid
    layout, which Slurm's autodetection does not recognise)."""
    done = subprocess.run(["stat", "-fc", "%T", "/sys/fs/cgroup"], capture_output=True, text=True)
    return "v2" if done.stdout.strip() == "cgroup2fs" else "v1"


def _ids(user: str) -> tuple[int, int]:
    import pwd

    entry = pwd.getpwnam(user)
    return entry.pw_uid, entry.pw_gid


def _start(c: Cluster) -> None:
    """As the README says: the controller's and the nodes' directories, munge, slurmctld,
    then slurmd on each node (in its namespace, as its NodeName)."""
    for name in ("slurmctld", "slurmd-node1", "slurmd-node2"):
        (c.top / "state" / name).mkdir(parents=True)
    subprocess.run([str(ROOT / "scripts" / "slurm-ci"), "munge"], check=True, capture_output=True)
    _accounting(c)
    conf = str(c.conf / "slurm.conf")
    started = c.tool("slurmctld", "-c", "-f", conf)
    assert started.returncode == 0, started.stderr
    for name, host in c.lab.hosts.items():
        host.start(["slurmd", "-D", "-N", name, "-f", conf], c.top / f"slurmd-{name}.out")

    def idle() -> bool:
        out = c.tool("sinfo", "-h", "-N", "-o", "%N %T").stdout.split()
        return out == ["node1", "idle", "node2", "idle"]

    c.wait("both nodes idle", idle, deadline=30)


def _accounting(c: Cluster) -> None:
    """README's accounting step: MariaDB (the test's own, on a socket), its user for
    slurmdbd, the password into slurmdbd.conf, slurmdbd, then cluster, account, users."""
    c.db.start()
    made = c.db.sql(
        f"CREATE USER 'slurm'@'localhost' IDENTIFIED BY '{PASSWORD}'; "
        "GRANT ALL ON slurm_acct_db.* TO 'slurm'@'localhost';"
    )
    assert made.returncode == 0, made.stderr
    dbd = c.conf / "slurmdbd.conf"
    text = dbd.read_text()
    assert "StoragePass=CHANGE-ME" in text.splitlines()
    dbd.write_text(text.replace("StoragePass=CHANGE-ME", f"StoragePass={PASSWORD}"))
    os.chown(dbd, 0, 0)  # SlurmUser's (root here), mode 600: slurmdbd refuses it otherwise
    assert dbd.stat().st_mode & 0o777 == 0o600
    env = dict(c.env, MYSQL_UNIX_PORT=c.db.socket)
    with open(c.top / "slurmdbd.out", "ab") as out:
        c.dbd = subprocess.Popen(
            ["slurmdbd", "-D"],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )

    def registered() -> bool:
        assert c.dbd is not None and c.dbd.poll() is None, (c.top / "slurmdbd.out").read_text()
        done = c.tool("sacctmgr", "-i", "add", "cluster", "gwtest")
        # an earlier try that slurmdbd took though its answer was lost: there already
        return done.returncode == 0 or "already exists" in done.stdout + done.stderr

    c.wait("slurmdbd taking the cluster", registered, deadline=60)
    for argv in (("add", "account", "lab"), ("add", "user", "root", "account=lab")):
        done = c.tool("sacctmgr", "-i", *argv)
        assert done.returncode == 0, done.stdout + done.stderr


def test_the_written_cluster_runs_a_two_gpu_job_on_each_node_and_refuses_a_wider_one(
    cluster: Cluster,
) -> None:
    lines = (cluster.conf / "slurm.conf").read_text().splitlines()
    # Every setting is under a comment (or a setting that is): each says why it is there.
    for i, line in enumerate(lines):
        if line and not line.startswith("#"):
            above = next(x for x in reversed(lines[:i]) if not x or x.startswith("#") or x)
            assert above.startswith("#") or "=" in above, line
    assert "SelectType=select/cons_tres" in lines
    assert "ConstrainDevices=yes" in (cluster.conf / "cgroup.conf").read_text().splitlines()

    jobs = {}
    script = (
        f'. {cluster.top}/env/"$SLURMD_NODENAME"; export GPUWARDEN_SIM GPUWARDEN_SIM_STATE '
        "GPUWARDEN_LEASE_DIR GPUWARDEN_STATE_DIR GPUWARDEN_SYSTEM_CONFIG PYTHONPATH; "
        f'echo "$SLURMD_NODENAME $SLURM_JOB_GPUS"; {" ".join(cluster.lab.python)} '
        "-m gpuwarden status --json"
    )
    out = cluster.top / "out"
    for node in ("node1", "node2"):
        done = cluster.tool(
            *("sbatch", "--parsable", "-w", node, "--gres=gpu:2", "-o", f"{out}/{node}.out"),
            *("--wrap", script),
        )
        assert done.returncode == 0, done.stderr
        jobs[node] = done.stdout.strip()
    for node, job in jobs.items():
        state = cluster.wait(
            f"job {job} on {node}", lambda j=job: cluster.state(j) in ("COMPLETED", "FAILED")
        )
        assert state and cluster.state(job) == "COMPLETED", (out / f"{node}.out").read_text()
        first, _, rest = (out / f"{node}.out").read_text().partition("\n")
        assert first.split() == [node, "0,1"]
        status = json.loads(rest)
        assert status["hostname"] == node  # ran in that node's namespace
        leased = [x["job"] for g in status["gpus"] for x in g["leases"]]
        assert leased == [f"slurm-{job}"] * 2, status["gpus"]  # the generated prolog's lease

    # Accounting spans the nodes: slurmdbd has both jobs, each on its node.
    def listed() -> list[list[str]]:
        out = cluster.tool(
            *("sacct", "-a", "-X", "-n", "-P", "-o", "JobID,NodeList,State,AllocTRES"),
            "-j",
            ",".join(jobs.values()),
        ).stdout
        rows = [x.split("|") for x in out.splitlines() if x]
        return rows if [r[2] for r in rows] == ["COMPLETED"] * 2 else []

    rows = cluster.wait("both jobs in sacct", listed)
    assert sorted((r[0], r[1]) for r in rows) == sorted((j, n) for n, j in jobs.items())
    assert all("gres/gpu=2" in r[3] for r in rows), rows
    # and gpuwarden's own history of the cluster reads it: both jobs, done, 2 GPUs each
    env = dict(cluster.env, PYTHONPATH=cluster.lab.path)
    done = subprocess.run(
        [*cluster.lab.python, "-m", "gpuwarden", "jobs", "--slurm", "--json"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    ended = {j["id"]: j for j in json.loads(done.stdout) if j["id"] in jobs.values()}
    assert sorted(ended) == sorted(jobs.values()), done.stdout + done.stderr
    assert {(j["state"], j["count"]) for j in ended.values()} == {("done", 2)}

    wide = cluster.tool("sbatch", "--gres=gpu:3", "--wrap", "true")
    assert wide.returncode != 0
    assert "Requested node configuration is not available" in wide.stderr


def test_a_node_that_cannot_answer_is_named_and_nothing_is_written(cluster: Cluster) -> None:
    target = cluster.top / "again"
    nobody = cluster.lab.hosts["node2"].peer  # this namespace's end: no sshd listens there
    done = cluster.lab.cli("slurm", "cluster", "node1", nobody, "--out", str(target))
    assert done.returncode == 2
    assert done.stderr.startswith(f"gpuwarden slurm: cannot describe every node: {nobody}: ssh: ")
    assert not target.exists()


def test_a_job_can_open_only_the_gpus_it_was_given(cluster: Cluster) -> None:
    """cgroup.conf's ConstrainDevices at work: opening a GPU's device file that is not
    the job's is refused by the kernel (EPERM), while its own gets as far as the driver,
    which these fake devices lack (ENXIO)."""
    dev = cluster.top / "dev"
    script = (
        f'echo "gpus=$SLURM_JOB_GPUS"; for i in 0 1; do (exec 3<{dev}/nvidia$i) 2>&1 || true; done'
    )
    out = cluster.top / "out" / "devices.out"
    done = cluster.tool(
        *("sbatch", "--parsable", "-w", "node2", "--gres=gpu:1", "-o", str(out)),
        *("--wrap", script),
    )
    assert done.returncode == 0, done.stderr
    job = done.stdout.strip()
    cluster.wait(f"job {job}", lambda: cluster.state(job) in ("COMPLETED", "FAILED"))
    lines = out.read_text().splitlines()
    mine = int(lines[0].removeprefix("gpus="))
    said = {i: next(x for x in lines[1:] if f"nvidia{i}" in x) for i in (0, 1)}
    assert "No such device or address" in said[mine], lines
    assert "Operation not permitted" in said[1 - mine], lines


def test_report_slurm_gives_the_gpu_hours_sacct_keeps_in_the_local_columns(
    cluster: Cluster,
) -> None:
    """Two users on accounts of their own run known jobs (GPUs, times); one job is
    requeued while it runs. `gpuwarden report --slurm --format csv` reads them back
    from slurmdbd through sacct: by job, user and account, the GPU-hours Slurm's own
    ElapsedRaw and AllocTRES give, every run of the requeued job counted."""
    student = cluster.lab.user
    for argv in (
        ("add", "account", "astro,vision"),
        ("add", "user", "root", "account=astro"),
        ("add", "user", student, "account=vision"),
    ):
        done = cluster.tool("sacctmgr", "-i", *argv)
        assert done.returncode == 0, done.stdout + done.stderr

    def sbatch(who: str, *argv: str) -> str:
        run = ["runuser", "-u", who, "--"] if who != "root" else []
        done = subprocess.run(
            [*run, "sbatch", "--parsable", "-D", "/tmp", "-o", "/dev/null", *argv],
            env=cluster.env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 0, done.stderr
        return done.stdout.strip().split(";")[0]

    wide = sbatch("root", "-A", "astro", "-w", "node1", "--gres=gpu:2", "--wrap", "sleep 4")
    narrow = sbatch(student, "-A", "vision", "-w", "node2", "--gres=gpu:1", "--wrap", "sleep 2")
    again = sbatch(
        "root", "-A", "astro", "-w", "node2", "--gres=gpu:1", "--requeue", "--wrap", "sleep 3"
    )
    cluster.wait(f"job {again} running", lambda: cluster.state(again) == "RUNNING")
    requeued = cluster.tool("scontrol", "requeue", again)
    assert requeued.returncode == 0, requeued.stderr
    # Slurm holds a requeued job back until the old run's credential expires (2 min);
    # an admin may start it sooner, as here.
    cluster.wait(f"job {again} pending again", lambda: cluster.state(again) == "PENDING")
    sooner = cluster.tool("scontrol", "update", f"JobId={again}", "StartTime=now")
    assert sooner.returncode == 0, sooner.stderr
    ids = (wide, narrow, again)

    def accounted() -> list[list[str]]:
        out = cluster.tool(
            *("sacct", "-a", "-X", "-D", "-n", "-P", "-o", "JobID,State,ElapsedRaw,AllocTRES"),
            *("-S", "now-1hour", "-E", "now", "-j", ",".join(ids)),
        ).stdout
        rows = [x.split("|") for x in out.splitlines() if x]
        states = sorted(r[1] for r in rows)
        return rows if states == ["COMPLETED"] * 3 + ["REQUEUED"] else []

    rows = cluster.wait("the jobs and the requeued run in sacct", accounted, deadline=240)
    hours: dict[str, float] = {}
    for job, _, elapsed, tres in rows:
        gpus = int(next(t for t in tres.split(",") if t.startswith("gres/gpu="))[9:])
        hours[job] = hours.get(job, 0.0) + gpus * int(elapsed) / 3600

    def report(by: str) -> dict[str, dict[str, str]]:
        env = dict(cluster.env, PYTHONPATH=cluster.lab.path)
        argv = ["report", "--slurm", "--format", "csv", "--by", by, "--since", "1h"]
        done = subprocess.run(
            [*cluster.lab.python, "-m", "gpuwarden", *argv],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 0, done.stderr
        lines = done.stdout.splitlines()
        assert lines[0].split(",")[:3] == ["period", by, "gpu_hours"], lines
        return {r[by]: r for r in csv.DictReader(io.StringIO(done.stdout))}

    by_job = report("job")
    for job in ids:
        assert float(by_job[job]["gpu_hours"]) == pytest.approx(hours[job], rel=0.05, abs=1e-3)
    assert by_job[again]["runs"] == "2" and by_job[again]["jobs"] == "1", by_job[again]
    by_account = report("account")
    assert float(by_account["vision"]["gpu_hours"]) == pytest.approx(hours[narrow], rel=0.05)
    astro = hours[wide] + hours[again]
    assert float(by_account["astro"]["gpu_hours"]) == pytest.approx(astro, rel=0.05)
    assert by_account["astro"]["jobs"] == "2" and by_account["astro"]["runs"] == "3"
    by_user = report("user")
    assert float(by_user[student]["gpu_hours"]) == pytest.approx(hours[narrow], rel=0.05)
