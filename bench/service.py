"""The queue service against a real single-node Slurm on this machine, side by side
(issue 12's performance targets).

    .venv/bin/python bench/service.py [--rounds 30] [--jobs 1000] [--idle 10]
                                      [--no-slurm] [--slurm-config default,tuned]
                                      [--held 10000] [--compare TREE]

Run as root (the service and slurmd both are). Everything is local: a Unix socket,
a simulated server of four idle A100s (tests/data/idle-4xa100.toml), and a Slurm
controller and node daemon started here on free loopback ports with four fake GPUs
(gres on /dev/tty0-3, as Slurm's own test suite does), in a directory of their own,
stopped at the end. Measured, for each system:

- submit-to-start: a client submits a one-GPU job on an idle machine; the job writes
  `date +%s%N` first thing. From just before the submit call (the in-process client
  for the service; `sbatch` as a command for Slurm, its start-up included: it is how
  Slurm is used) to that timestamp.
- free-to-next-start: a job holding every GPU waits on a FIFO; a one-GPU job waits
  behind it. The bench opens the FIFO; the holder writes a timestamp and exits; the
  waiting job writes one as it starts. Target for the service: p50 <= 20 ms,
  p99 <= 100 ms.
- makespan overhead: N jobs of `sleep 0.05` on 4 GPUs, submitted at once (the
  service: one request each over one connection; Slurm: one job array, its fastest
  path). From the first submit to the last job's end, minus the ideal N/4 x 50 ms.
- idle CPU: utime+stime of the service (and of slurmctld) over `--idle` seconds with
  nothing queued (target for the service: < 0.5% of a core).
- with `--held N`, submit-to-start and free-to-next again beside N held jobs
  (one array each: the service's `submit --hold`, Slurm's `sbatch --hold`).
- with `--compare TREE` (the service alone): submit-to-start and free-to-next of this
  tree's service and of TREE's (another checkout, its own src), both serving at once,
  their rounds interleaved so that load hits them alike, and the ratio (TREE / this).
- attached run (the service only): `gpuwarden run -g 1 -- true` through the service,
  the same command on the direct path, and `python -c pass`, in turn round after
  round (target: through the service <= 40 ms over `python -c pass`).

Slurm runs twice: with its default SchedulerParameters (sched_interval=60,
batch_sched_delay=3, default_queue_depth=100, bf_interval=30, ...), and tuned for
latency (`TUNED` below). Ratios printed are Slurm / service (higher: the service is
faster); the target is >= 10x on each.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Optional

ROOT = Path(__file__).resolve().parent.parent
SRC = str(ROOT / "src")
SPEC = str(ROOT / "tests" / "data" / "idle-4xa100.toml")
sys.path.insert(0, SRC)

GPUS = 4
JOB_SECONDS = 0.05
TUNED = (
    "sched_interval=1,sched_min_interval=0,batch_sched_delay=0,default_queue_depth=10000,"
    "bf_interval=1,sched_max_job_start=0"
)


def now_ns() -> int:
    return time.time_ns()


def wait_for(check: Callable[[], Any], timeout: float, what: str, step: float = 0.002) -> Any:
    """Poll `check` until it returns something true; a generous deadline, then fail."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out waiting for {what}")
        time.sleep(step)


def read_stamp(path: Path) -> Optional[int]:
    try:
        text = path.read_text().strip()
    except FileNotFoundError:
        return None
    return int(text) if text.isdigit() else None


def cpu_ticks(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as fh:
        fields = fh.read().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])  # utime + stime


def idle_cpu(pid: int, seconds: float) -> float:
    """Percent of one core `pid` used over `seconds`."""
    hz = os.sysconf("SC_CLK_TCK")
    t0, c0 = time.monotonic(), cpu_ticks(pid)
    time.sleep(seconds)  # measuring an interval, not waiting for a condition
    return 100.0 * (cpu_ticks(pid) - c0) / hz / (time.monotonic() - t0)


def sim_env(work: Path, tag: str = "", src: str = SRC) -> dict[str, str]:
    """This tree's gpuwarden (or `src`'s) on the simulated four A100s, with its own
    state in `work`, under no lab's or user's settings (a machine's
    /etc/gpuwarden/config.toml with `max_gpus_per_user = 1` would make the makespan one
    job at a time)."""
    return dict(
        os.environ,
        PYTHONPATH=src,
        GPUWARDEN_SIM=SPEC,
        GPUWARDEN_SIM_STATE=str(work / f"sim{tag}"),
        GPUWARDEN_LEASE_DIR=str(work / f"leases{tag}"),
        GPUWARDEN_SYSTEM_CONFIG=str(work / "none.toml"),
        XDG_CONFIG_HOME=str(work / "xdg"),
    )


# --- the two systems, behind one small interface --------------------------------------


class GpuwardenQueue:
    name = "gpuwarden serve"

    def __init__(self, work: Path, profile: Optional[str] = None, src: str = SRC) -> None:
        self.work = work
        self.socket = str(work / "gw.sock")
        env = sim_env(work, src=src)
        self.proc = subprocess.Popen(
            [
                sys.executable,
                *(["-m", "cProfile", "-o", profile] if profile else []),
                "-m",
                "gpuwarden",
                "serve",
                "--socket",
                self.socket,
                "--state-dir",
                str(work / "state"),
                "--log-level",
                "WARNING",
            ],
            env=env,
            stdout=open(work / "serve.log", "ab"),  # noqa: SIM115 - the child owns it
            stderr=subprocess.STDOUT,
        )
        from gpuwarden.queueclient.client import connect

        self.ids: list[int] = []  # submitted, not yet seen ended (`drained`)
        self.client = wait_for(lambda: self._connect(connect), 60, "the service to start", 0.01)
        # Answered only from the loop: start-up (imports, the first snapshot, recovery)
        # is over, and does not count as idle CPU.
        self.client.call("hello")
        self.pid = self.proc.pid

    def _connect(self, connect: Callable[..., Any]) -> Any:
        from gpuwarden.base.errors import UserError

        with contextlib.suppress(UserError):
            return connect(self.socket)
        return None

    def submit(self, script: str, gpus: int = 1, **extra: Any) -> None:
        reply = self.client.call(
            "submit",
            argv=["sh", "-c", script],
            cwd=str(self.work),
            env={"PATH": "/usr/bin:/bin"},
            output="/dev/null",
            request={"count": gpus},
            **extra,
        )
        self.ids.append(int(reply["job"]))

    def submit_many(self, script: str, n: int) -> None:
        for _ in range(n):
            self.submit(script)

    def hold_many(self, n: int) -> None:
        """`n` held jobs in one array, left in the queue for what is measured next."""
        self.submit("true", hold=True, array=f"1-{n}")
        self.ids.clear()

    def drained(self) -> bool:
        """Whether every job submitted since the last drain has ended (held ones aside)."""
        for start in range(0, len(self.ids), 500):
            if self.client.call("queue", ids=self.ids[start : start + 500])["total"]:
                return False
        self.ids.clear()
        return True

    def close(self) -> None:
        self.client.close()
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(30)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Slurm:
    """slurmctld + slurmd with four fake GPUs, in a directory of their own, on free ports
    (another Slurm on this machine is left alone)."""

    def __init__(self, work: Path, tuned: bool) -> None:
        self.name = "Slurm (tuned)" if tuned else "Slurm (defaults)"
        self.work = work
        self.scheduler = TUNED if tuned else "(defaults)"
        host = socket.gethostname().split(".")[0]
        for sub in ("state", "spool", "log", "out"):
            (work / sub).mkdir(parents=True, exist_ok=True)
        conf = work / "slurm.conf"
        lines = [
            f"ClusterName=gwbench{os.getpid()}",
            f"SlurmctldHost={host}",
            f"SlurmctldPort={free_port()}",
            f"SlurmdPort={free_port()}",
            "SlurmUser=root",
            "AuthType=auth/munge",
            f"StateSaveLocation={work}/state",
            f"SlurmdSpoolDir={work}/spool",
            f"SlurmctldPidFile={work}/slurmctld.pid",
            f"SlurmdPidFile={work}/slurmd.pid",
            f"SlurmctldLogFile={work}/log/slurmctld.log",
            f"SlurmdLogFile={work}/log/slurmd.log",
            "ProctrackType=proctrack/linuxproc",
            "TaskPlugin=task/none",
            "JobAcctGatherType=jobacct_gather/none",
            "AccountingStorageType=accounting_storage/none",
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_Core",
            "MpiDefault=none",
            "SlurmdParameters=config_overrides",  # 8 CPUs declared on a 2-core box
            "ReturnToService=2",
            "MinJobAge=600",
            "MaxJobCount=100000",
            "MaxArraySize=100001",
            "GresTypes=gpu",
            f"NodeName={host} CPUs=8 RealMemory=2000 Gres=gpu:{GPUS} State=UNKNOWN",
            "PartitionName=bench Nodes=ALL Default=YES MaxTime=INFINITE State=UP",
        ]
        if tuned:
            lines.append(f"SchedulerParameters={TUNED}")
        conf.write_text("\n".join(lines) + "\n")
        (work / "gres.conf").write_text(f"Name=gpu File=/dev/tty[0-{GPUS - 1}]\n")
        self.env = dict(os.environ, SLURM_CONF=str(conf))
        ensure_munge()
        subprocess.run(["slurmctld", "-c", "-f", str(conf)], env=self.env, check=True)
        subprocess.run(["slurmd", "-f", str(conf)], env=self.env, check=True)
        wait_for(self._idle, 60, "the Slurm node to be idle", 0.2)
        self.pid = int((work / "slurmctld.pid").read_text())

    def _idle(self) -> bool:
        out = subprocess.run(
            ["sinfo", "-h", "-N", "-o", "%T"], env=self.env, capture_output=True, text=True
        )
        return out.stdout.strip() == "idle"

    def submit(self, script: str, gpus: int = 1) -> None:
        self._sbatch([f"--gres=gpu:{gpus}", "--wrap", script])

    def submit_many(self, script: str, n: int) -> None:
        self._sbatch([f"--array=1-{n}", "--gres=gpu:1", "--wrap", script])

    def hold_many(self, n: int) -> None:
        self._sbatch(["--hold", f"--array=1-{n}", "--gres=gpu:1", "--wrap", "true"])

    def _sbatch(self, args: list[str]) -> None:
        subprocess.run(
            ["sbatch", "-Q", "-c", "1", "--mem=10", "-o", "/dev/null", "-D", str(self.work), *args],
            env=self.env,
            check=True,
        )

    def drained(self) -> bool:
        """Whether no job is left but the held ones (`hold_many`)."""
        out = subprocess.run(
            ["squeue", "-h", "-o", "%r"], env=self.env, capture_output=True, text=True
        )
        return all(r == "JobHeldUser" for r in out.stdout.split())

    def close(self) -> None:
        for name in ("slurmd.pid", "slurmctld.pid"):
            with contextlib.suppress(OSError, ValueError):
                pid = int((self.work / name).read_text())
                os.kill(pid, signal.SIGTERM)
                wait_for(lambda p=pid: not os.path.exists(f"/proc/{p}"), 30, name, 0.05)


def ensure_munge() -> None:
    """Slurm authenticates through munged; start it (as the Debian package would) if none runs."""
    if subprocess.run(["munge", "-n"], capture_output=True).returncode == 0:
        return
    os.makedirs("/run/munge", exist_ok=True)
    shutil.chown("/run/munge", "munge", "munge")
    subprocess.run(["su", "-s", "/bin/sh", "munge", "-c", "/usr/sbin/munged"], check=True)
    wait_for(
        lambda: subprocess.run(["munge", "-n"], capture_output=True).returncode == 0, 30, "munge"
    )


# --- the measures -----------------------------------------------------------------------


def submit_to_start(q: Any, work: Path, rounds: int, tag: str = "") -> list[float]:
    out = []
    for i in range(rounds):
        stamp = work / f"sts-{tag}{i}"
        t0 = now_ns()
        q.submit(f"date +%s%N > {stamp}.tmp; mv {stamp}.tmp {stamp}")
        started = wait_for(lambda s=stamp: read_stamp(s), 120, "a job to start")
        out.append((started - t0) / 1e6)
        wait_for(q.drained, 120, "the job to end", 0.01)
    return out


def free_to_next(q: Any, work: Path, rounds: int, tag: str = "") -> list[float]:
    out = []
    for i in range(rounds):
        fifo, up = work / f"ftn-{tag}{i}.fifo", work / f"ftn-{tag}{i}.up"
        freed, began = work / f"ftn-{tag}{i}.freed", work / f"ftn-{tag}{i}.began"
        os.mkfifo(fifo)
        q.submit(f"touch {up}; read x < {fifo}; date +%s%N > {freed}", gpus=GPUS)
        wait_for(up.exists, 120, "the holder to start", 0.01)
        q.submit(f"date +%s%N > {began}.tmp; mv {began}.tmp {began}")
        time.sleep(0.3)  # let the waiting job be seen and planned as waiting (not a race)
        assert not began.exists(), "the waiting job started while every GPU was held"
        with open(fifo, "w") as fh:  # the holder reads a line and ends
            fh.write("go\n")
        b = wait_for(lambda s=began: read_stamp(s), 120, "the waiting job to start")
        f = wait_for(lambda s=freed: read_stamp(s), 10, "the holder's stamp")
        out.append((b - f) / 1e6)
        wait_for(q.drained, 120, "the jobs to end", 0.01)
    return out


def makespan(q: Any, work: Path, n: int) -> tuple[float, float]:
    """(makespan seconds, overhead seconds over the ideal)."""
    log = work / "makespan.log"
    t0 = now_ns()
    q.submit_many(f"sleep {JOB_SECONDS}; date +%s%N >> {log}", n)
    wait_for(q.drained, 3600, "every job to end", 0.1)
    ends = [int(x) for x in log.read_text().split()]
    assert len(ends) == n, f"{len(ends)} of {n} jobs ended"
    span = (max(ends) - t0) / 1e9
    return span, span - n / GPUS * JOB_SECONDS


def attached_run(q: GpuwardenQueue, work: Path, rounds: int) -> dict[str, float]:
    """Median wall ms of `python -c pass`, `gpuwarden run -g 1 -- true` through the
    service, and the same command on the direct path (no service at its socket), run
    in turn round after round so that load hits them alike."""
    gw = shutil.which("gpuwarden", path=str(Path(sys.executable).parent))
    entry = [gw] if gw else [sys.executable, "-m", "gpuwarden"]
    env = sim_env(work, "-direct")
    env.pop("PYTHONDONTWRITEBYTECODE", None)  # an installed gpuwarden has its bytecode
    cases = {
        "python -c pass": ([sys.executable, "-c", "pass"], env),
        "run via the service": (
            [*entry, "run", "-g", "1", "--", "true"],
            dict(env, GPUWARDEN_SOCKET=q.socket),
        ),
        "run, direct": (
            [*entry, "run", "-g", "1", "--", "true"],
            dict(env, GPUWARDEN_SOCKET=str(work / "no-service.sock")),
        ),
    }
    times: dict[str, list[float]] = {name: [] for name in cases}
    for warm in (True, False):
        for _ in range(1 if warm else rounds):
            for name, (argv, case_env) in cases.items():
                t0 = time.perf_counter()
                done = subprocess.run(argv, env=case_env, capture_output=True, cwd=work)
                elapsed = (time.perf_counter() - t0) * 1000
                if done.returncode != 0:
                    raise SystemExit(f"{name}: exit {done.returncode}: {done.stderr[-400:]!r}")
                if not warm:
                    times[name].append(elapsed)
    return {name: statistics.median(ts) for name, ts in times.items()}


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def measure(q: Any, work: Path, args: argparse.Namespace) -> dict[str, Any]:
    result: dict[str, Any] = {"name": q.name}
    print(f"-- {q.name}", flush=True)
    result["idle_cpu"] = idle_cpu(q.pid, args.idle) if args.idle else math.nan
    print(f"   idle CPU {result['idle_cpu']:.3f}% of a core", flush=True)
    sts = submit_to_start(q, work, args.rounds) if args.rounds else [math.nan]
    result["sts"] = (statistics.median(sts), pct(sts, 0.99))
    print("   submit-to-start p50 {:.1f} ms, p99 {:.1f} ms".format(*result["sts"]), flush=True)
    ftn = free_to_next(q, work, args.rounds) if args.rounds else [math.nan]
    result["ftn"] = (statistics.median(ftn), pct(ftn, 0.99))
    print("   free-to-next-start p50 {:.1f} ms, p99 {:.1f} ms".format(*result["ftn"]), flush=True)
    if args.rounds and isinstance(q, GpuwardenQueue):
        med = attached_run(q, work, args.rounds)
        result["attached"] = med
        py = med["python -c pass"]
        print(
            "   `run -g 1 -- true` through the service {:.1f} ms, direct {:.1f} ms, "
            "`python -c pass` {:.1f} ms: the service's adds {:+.1f} ms (target <= 40), "
            "the direct path's {:+.1f} ms".format(
                med["run via the service"],
                med["run, direct"],
                py,
                med["run via the service"] - py,
                med["run, direct"] - py,
            ),
            flush=True,
        )
    if args.jobs:
        result["makespan"] = makespan(q, work, args.jobs)
        print(
            "   makespan of {} jobs {:.2f} s, overhead {:.2f} s".format(
                args.jobs, *result["makespan"]
            ),
            flush=True,
        )
    if args.held and args.rounds:
        q.hold_many(args.held)
        for key, measured in (("sts", submit_to_start), ("ftn", free_to_next)):
            got = measured(q, work, args.rounds, "held-")
            result[key + "_held"] = (statistics.median(got), pct(got, 0.99))
        print(
            "   beside {} held jobs: submit-to-start p50 {:.1f} ms, p99 {:.1f} ms; "
            "free-to-next-start p50 {:.1f} ms, p99 {:.1f} ms".format(
                args.held, *result["sts_held"], *result["ftn_held"]
            ),
            flush=True,
        )
    return result


@contextlib.contextmanager
def workdir(prefix: str) -> Iterator[Path]:
    d = Path(tempfile.mkdtemp(prefix=prefix))
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


def main() -> int:
    from conditions import bytecode, tree_root

    bytecode()
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=30, help="latency samples of each kind")
    parser.add_argument("--jobs", type=int, default=1000, help="jobs in the makespan run (0: skip)")
    parser.add_argument("--idle", type=float, default=10.0, help="seconds of idle CPU reading")
    parser.add_argument("--no-slurm", action="store_true", help="the service alone")
    parser.add_argument(
        "--held", type=int, default=0, help="then measure the latencies again beside N held jobs"
    )
    parser.add_argument("--slurm-config", default="default,tuned")
    parser.add_argument(
        "--profile", metavar="FILE", help="run the service under cProfile, stats to FILE"
    )
    parser.add_argument(
        "--compare", metavar="TREE", help="the latencies beside TREE's service, interleaved"
    )
    args = parser.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("run as root: the service and slurmd start jobs as their users")
    if args.compare:
        return compare(args, tree_root(args.compare))
    results = []
    with workdir("gw-bench-service-") as work:
        q = GpuwardenQueue(work, args.profile)
        try:
            results.append(measure(q, work, args))
        finally:
            q.close()
    if not args.no_slurm:
        for config in args.slurm_config.split(","):
            with workdir("gw-bench-slurm-") as work:
                work.chmod(0o755)
                slurm = Slurm(work, tuned=config == "tuned")
                try:
                    print(f"   SchedulerParameters: {slurm.scheduler}")
                    results.append(measure(slurm, work, args))
                finally:
                    slurm.close()
    report(results, args)
    return 0


def compare(args: argparse.Namespace, other: Path) -> int:
    """This tree's service and `other`'s, serving at once, their latency rounds
    interleaved (one of each in turn, the first of each pair alternating)."""
    from conditions import bytecode

    bytecode((ROOT, other))
    with workdir("gw-bench-service-") as mine, workdir("gw-bench-other-") as theirs:
        queues = {
            "this tree": (GpuwardenQueue(mine), mine),
            str(other): (GpuwardenQueue(theirs, src=str(other / "src")), theirs),
        }
        try:
            phases = [("", 0)] + ([("held-", args.held)] if args.held else [])
            for tag, held in phases:
                for q, _ in queues.values():
                    if held:
                        q.hold_many(held)
                for key, measured in (
                    ("submit-to-start", submit_to_start),
                    ("free-to-next", free_to_next),
                ):
                    got: dict[str, list[float]] = {name: [] for name in queues}
                    for i in range(args.rounds):
                        names = list(queues) if i % 2 == 0 else list(reversed(queues))
                        for name in names:
                            q, work = queues[name]
                            got[name] += measured(q, work, 1, f"{tag}{i}-")
                    p50 = {name: statistics.median(ts) for name, ts in got.items()}
                    beside = f" beside {held} held" if held else ""
                    for name, ts in got.items():
                        p99 = pct(ts, 0.99)
                        print(
                            f"{key}{beside}: {name:24} p50 {p50[name]:6.1f} ms, p99 {p99:6.1f} ms"
                        )
                    mine_p50, theirs_p50 = p50["this tree"], p50[str(other)]
                    print(
                        f"{key}{beside}: {other!s} / this tree {theirs_p50 / mine_p50:.2f}x",
                        flush=True,
                    )
        finally:
            for q, _ in queues.values():
                q.close()
    return 0


def report(results: list[dict[str, Any]], args: argparse.Namespace) -> None:
    gw = results[0]
    print()
    print(
        f"{'':22} {'idle CPU %':>10} {'submit>start p50/p99 ms':>24} {'free>next p50/p99 ms':>21}",
        end="",
    )
    print(f" {'makespan overhead s':>20}" if args.jobs else "")
    for r in results:
        line = f"{r['name']:22} {r['idle_cpu']:10.3f} {r['sts'][0]:11.1f} /{r['sts'][1]:8.1f}"
        line += f"   {r['ftn'][0]:8.1f} /{r['ftn'][1]:8.1f}"
        if args.jobs:
            line += f" {r['makespan'][1]:20.2f}"
        print(line)
    for r in results[1:]:
        ratios = [r["sts"][0] / gw["sts"][0], r["ftn"][0] / gw["ftn"][0]]
        text = f"{r['name']} / service: submit-to-start {ratios[0]:.1f}x, "
        text += f"free-to-next {ratios[1]:.1f}x"
        if args.jobs:
            ratios.append(r["makespan"][1] / max(gw["makespan"][1], 1e-9))
            text += f", makespan overhead {ratios[2]:.1f}x"
        print(text + f"  (>= 10x on each: {all(x >= 10 for x in ratios)})")
        if args.held and "sts_held" in r and "sts_held" in gw:
            print(
                f"   beside {args.held} held: submit-to-start "
                f"{r['sts_held'][0] / gw['sts_held'][0]:.1f}x, "
                f"free-to-next {r['ftn_held'][0] / gw['ftn_held'][0]:.1f}x"
            )
    for key in ("sts", "ftn", "sts_held", "ftn_held"):
        if key in gw:
            print(f"service {key} p50 {gw[key][0]:.1f} ms <= 10 ms: {gw[key][0] <= 10}")
    p50, p99 = gw["ftn"]
    print(
        f"service targets: free-to-next p50 {p50:.1f} <= 20 ms: {p50 <= 20}; "
        f"p99 {p99:.1f} <= 100 ms: {p99 <= 100}; idle CPU {gw['idle_cpu']:.3f} < 0.5%: "
        f"{gw['idle_cpu'] < 0.5}"
    )


if __name__ == "__main__":
    sys.exit(main())
