"""The enforcement watcher: one reading at a time (fake readings), and for real on
the simulated machine with `gpuwarden run` jobs."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from gpuwarden.leases import LeaseInfo
from gpuwarden.machine.inventory import Gpu, GpuProcess, Snapshot
from gpuwarden.monitoring.enforcer import Enforcer, lineage
from gpuwarden.usage.enforcement import EnforceSettings
from repo import SRC
from waiting import wait_for

GiB = 2**30


def snap(procs: dict[int, list[tuple[int, int, str]]], util: int = 50) -> Snapshot:
    """GPUs 0-3; `procs`: index -> [(pid, memory GiB, user)]."""
    gpus = tuple(
        Gpu(
            index=i,
            uuid=f"GPU-{i}",
            minor=i,
            utilization_gpu=util,
            memory_used=sum(m for _, m, _ in procs.get(i, [])) * GiB,
            processes=tuple(GpuProcess(pid, m * GiB, user) for pid, m, user in procs.get(i, [])),
        )
        for i in range(4)
    )
    return Snapshot(taken_at=0.0, hostname="h", gpus=gpus)


def lease(gpu: int, pid: int, user: str, mem: int | None = None) -> LeaseInfo:
    return LeaseInfo(
        f"GPU-{gpu}", user, pid, "cmd", 0.0, None if mem is None else mem * GiB, f"j{pid}"
    )


TREE = {100: (100, 1), 101: (101, 100, 1), 300: (300, 1)}


def test_memory_over_is_warned_then_acted_on_after_the_grace() -> None:
    e = Enforcer(
        EnforceSettings(memory_grace=30, memory_action="kill"),
        lineage_of=lambda p: TREE.get(p, (p,)),
    )
    leases = [lease(2, 100, "alice", mem=10)]
    over = snap({2: [(100, 8, "alice"), (101, 8, "alice")]})  # 16 GiB in the job's tree
    acts = e.step(over, leases, 0.0)
    assert [(a.policy, a.kind, a.pid) for a in acts] == [("memory", "warn", 100)]
    assert "16.0GiB" in acts[0].message and "alice" in acts[0].message
    assert e.step(over, leases, 10.0) == []
    acts = e.step(over, leases, 30.0)
    assert [(a.kind, a.group) for a in acts] == [("kill", True)]
    within = snap({2: [(100, 5, "alice"), (101, 5, "alice")]})
    assert e.step(within, leases, 40.0) == [] and e.memory == {}


def test_unleased_use_on_a_leased_gpu_is_reported_with_its_user_at_once() -> None:
    e = Enforcer(EnforceSettings(), lineage_of=lambda p: TREE.get(p, (p,)))
    leases = [lease(2, 100, "alice")]
    acts = e.step(snap({2: [(100, 8, "alice"), (300, 4, "carol")]}), leases, 0.0)
    assert [(a.policy, a.kind, a.pid, a.user) for a in acts] == [
        ("unleased", "notify", 300, "carol")
    ]
    assert "leased to alice" in acts[0].message


def test_an_idle_lease_is_reported_once_and_an_active_one_never() -> None:
    e = Enforcer(EnforceSettings(idle_after=60), lineage_of=lambda p: (p,))
    leases = [lease(1, 100, "bob")]
    kinds = [
        [a.kind for a in e.step(snap({1: [(100, 2, "bob")]}, util=0), leases, t)]
        for t in (0, 30, 61, 90)
    ]
    assert kinds == [[], [], ["report"], []]
    e = Enforcer(EnforceSettings(idle_after=60), lineage_of=lambda p: (p,))
    for t in range(0, 600, 30):
        assert e.step(snap({1: [(100, 2, "bob")]}, util=3), leases, float(t)) == []


def test_lineage_follows_the_kernel() -> None:
    chain = lineage(os.getpid())
    assert chain[0] == os.getpid() and chain[1] == os.getppid()
    assert lineage(4_200_001) == (4_200_001,)  # a simulated process: no /proc entry


# --- for real: gpuwarden run jobs on the simulated machine ---------------------------------------


def _env(**extra: str) -> dict[str, str]:
    env = dict(os.environ, PYTHONPATH=str(SRC))
    env.update(extra)
    return env


def _start_job(mem: str, holds: str) -> subprocess.Popen[str]:
    cmd = [sys.executable, "-m", "gpuwarden", "run", "--mem", mem, "--gpus", "7", "--"]
    cmd += [sys.executable, "-m", "gpuwarden", "sim", "occupy", "--mem", holds, "--"]
    cmd += [sys.executable, "-c", "import sys; sys.stdin.read()"]
    return subprocess.Popen(
        cmd, env=_env(), stdin=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def _wait_until_seen(proc: subprocess.Popen[str]) -> None:
    from gpuwarden.leases import list_leases
    from gpuwarden.machine.inventory import read_snapshot

    def seen() -> bool:
        gpu7 = read_snapshot().gpus[7]
        if gpu7.processes and any(x.mem is not None for x in list_leases()):
            return True
        assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
        return False

    wait_for(seen, 60, "the job on GPU 7")


def test_a_job_over_its_mem_is_warned_and_killed_within_the_grace(sim, cli) -> None:
    sim("server-8xa100")
    job = _start_job("10GiB", "30GiB")
    try:
        _wait_until_seen(job)
        watch = subprocess.Popen(
            [sys.executable, "-m", "gpuwarden", "enforce", "--watch"],
            env=_env(
                GPUWARDEN_ENFORCE_MEMORY_ACTION="kill",
                GPUWARDEN_ENFORCE_MEMORY_GRACE="1",
                GPUWARDEN_ENFORCE_POLL_SECONDS="0.2",
            ),
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            code = job.wait(timeout=60)
        finally:
            watch.terminate()
            log = watch.communicate(timeout=60)[1]
        assert code == 128 + 15, log  # SIGTERM reached the job
        warned, killed = _logged_at(log, "memory warn"), _logged_at(log, "memory kill")
        # Killed once the 1 s grace ran out, at a later poll. Log times are taken after each
        # reading, the grace between readings' starts: hence the slack below 1 s (the exact
        # grace is property-tested on the policy function).
        assert 0.5 <= killed - warned < 1.0 + 0.2 + 5, log
        warn = log.index("memory warn")
        assert "30.0GiB" in log[warn:] and "over its --mem 10.0GiB" in log[warn:]
    finally:
        if job.poll() is None:
            job.kill()
        job.communicate()


def _logged_at(log: str, words: str) -> float:
    """The time of the first log line with `words` ("2026-11-30 17:49:38,126 ...")."""
    from datetime import datetime

    line = next(x for x in log.splitlines() if words in x)
    return datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f").timestamp()


def test_within_its_mem_and_under_notify_nothing_is_killed(sim, cli) -> None:
    sim("server-8xa100")
    job = _start_job("10GiB", "30GiB")
    try:
        _wait_until_seen(job)
        out = cli("enforce", "--once", env={"GPUWARDEN_ENFORCE_MEMORY_GRACE": "0"})
        assert out.returncode == 1 and "memory notify" in out.stderr, out.stderr
        assert "SIGTERM" not in out.stderr
        assert job.poll() is None  # notify (the default) never kills
    finally:
        job.communicate("")
    assert job.returncode == 0


def test_an_unleased_process_is_reported_with_its_user(sim, cli) -> None:
    sim("server-8xa100")
    out = cli("enforce", "--once")
    assert out.returncode == 1
    assert "pid 4200005 of carol uses GPU 5 without a lease" in out.stderr


def test_enforce_on_a_quiet_machine_says_nothing(sim, cli, tmp_path: Path) -> None:
    spec = tmp_path / "quiet.toml"
    spec.write_text('[[gpu]]\nmodel = "T4"\n')
    out = cli("enforce", env={"GPUWARDEN_SIM": str(spec)})
    assert (out.returncode, out.stderr) == (0, "")


def test_a_process_that_ignores_sigterm_gets_sigkill_at_a_later_reading() -> None:
    from gpuwarden.monitoring.enforcer import KILL_AFTER, Action

    stubborn = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import signal, sys; signal.signal(signal.SIGTERM, signal.SIG_IGN);"
            "print('ready', flush=True); sys.stdin.read()",
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert stubborn.stdout is not None and stubborn.stdout.readline() == "ready\n"
        e = Enforcer(EnforceSettings())
        kill = Action("kill", "unleased", "GPU-2", 2, stubborn.pid, "carol", "test")
        e.carry_out([kill], 0.0)
        assert stubborn.poll() is None and stubborn.pid in e.terminated  # SIGTERM ignored
        e.carry_out([], KILL_AFTER / 2)
        assert stubborn.poll() is None
        e.carry_out([], KILL_AFTER)
        assert stubborn.wait(timeout=60) == -9
        assert e.terminated == {}
    finally:
        if stubborn.poll() is None:
            stubborn.kill()
        stubborn.communicate()
