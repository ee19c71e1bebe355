"""`gpuwarden run` end to end on the simulated server: environment, exit codes,
signals, waiting, killed holders, bad input."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

import gpuwarden.leases as lease
from gpuwarden.jobs import allocation
from repo import SRC
from waiting import wait_for


def free_all() -> None:
    """Empty the simulated server (its spec starts with colleagues' jobs on GPUs 0-5)."""
    from gpuwarden.sim import Machine

    machine = Machine.open()
    for p in machine.state()["processes"]:
        machine.remove_process(p["pid"])


def env_dump(tmp: Path, name: str = "env.json") -> str:
    """A job that writes its environment to a file."""
    out = tmp / name
    return f"import json, os; json.dump(dict(os.environ), open({str(out)!r}, 'w'))"


def popen(*args: str, **kw: Any) -> subprocess.Popen[str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(SRC)
    env.update(kw.pop("env", {}))
    return subprocess.Popen(
        [sys.executable, "-m", "gpuwarden", *args],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        **kw,
    )


# A job that reports its pid, then waits until a file appears (or a signal comes).
HOLD = """
import os, signal, sys, time
mark = sys.argv[1]
def on(sig, _):
    open(mark + ".sig", "w").write(str(sig)); sys.exit(40)
signal.signal(signal.SIGTERM, on)
with open(mark + ".pid.tmp", "w") as f:  # renamed whole: a reader never sees it empty
    f.write(str(os.getpid()))
os.rename(mark + ".pid.tmp", mark + ".pid")
end = time.time() + 60  # never outlive a failed test by much
while not os.path.exists(mark + ".go") and time.time() < end:
    time.sleep(0.02)
"""


def hold(tmp: Path, name: str, *run_args: str) -> tuple[subprocess.Popen[str], Path]:
    mark = tmp / name
    proc = popen("run", *run_args, "--", sys.executable, "-c", HOLD, str(mark))
    wait_for(lambda: Path(str(mark) + ".pid").exists(), 10, "the job's pid file")
    return proc, mark


def test_job_gets_its_gpu_in_the_environment(sim, cli, tmp_path: Path) -> None:
    sim("server-8xa100")
    r = cli("run", "-g", "1", "--", sys.executable, "-c", env_dump(tmp_path))
    assert r.returncode == 0, r.stderr
    env = json.loads((tmp_path / "env.json").read_text())
    assert env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
    # GPUs 0-5 are busy with colleagues' jobs in this spec: 6 or 7 (7 first: 0 kept last)
    assert env["CUDA_VISIBLE_DEVICES"] in ("6", "7")
    assert env["GPUWARDEN_GPU_INDICES"] == env["CUDA_VISIBLE_DEVICES"]
    assert env["GPUWARDEN_GPUS"].startswith("GPU-")
    assert env["GPUWARDEN_JOB"]
    assert env["GPUWARDEN_LEASE"] == "exclusive"
    assert "GPUWARDEN_MEM_LIMIT" not in env
    assert lease.list_leases() == []  # freed on exit


def test_uuid_option_exports_uuids(sim, cli, tmp_path: Path) -> None:
    sim("server-8xa100")
    r = cli("run", "-g", "1", "--uuid", "--", sys.executable, "-c", env_dump(tmp_path))
    assert r.returncode == 0, r.stderr
    env = json.loads((tmp_path / "env.json").read_text())
    assert env["CUDA_VISIBLE_DEVICES"] == env["GPUWARDEN_GPUS"]


def test_two_concurrent_jobs_get_different_gpus(sim, cli, tmp_path: Path) -> None:
    sim("server-8xa100")
    first, mark = hold(tmp_path, "a", "-g", "1")
    try:
        [info] = lease.list_leases()
        assert info.pid == int(Path(str(mark) + ".pid").read_text())
        assert "python" in info.command
        r = cli("run", "-g", "1", "--", sys.executable, "-c", env_dump(tmp_path))
        assert r.returncode == 0, r.stderr
        env = json.loads((tmp_path / "env.json").read_text())
        assert env["GPUWARDEN_GPUS"] != info.uuid
        # both free GPUs taken: a third is told why, at once, with the "busy" code
        second, mark2 = hold(tmp_path, "b", "-g", "1")
        r = cli("run", "-g", "1", "--", "true")
        assert r.returncode == lease.EXIT_BUSY
        assert "none is free now" in r.stderr
        Path(str(mark2) + ".go").touch()
        assert second.wait(10) == 0
    finally:
        Path(str(mark) + ".go").touch()
        first.wait(10)


def test_exit_codes(sim, cli) -> None:
    sim("server-8xa100")
    assert cli("run", "-g", "1", "--", "sh", "-c", "exit 7").returncode == 7
    assert cli("run", "-g", "1", "--", "sh", "-c", "kill -TERM $$").returncode == 128 + 15
    r = cli("run", "-g", "1", "--", "no-such-command-xyz")
    assert r.returncode == 127
    assert r.stderr.strip() == "gpuwarden run: command not found: no-such-command-xyz"
    assert lease.list_leases() == []


def test_signals_are_forwarded_to_the_job(sim, tmp_path: Path) -> None:
    sim("server-8xa100")
    proc, mark = hold(tmp_path, "a", "-g", "1")
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(10) == 40
    assert Path(str(mark) + ".sig").read_text() == str(int(signal.SIGTERM))


def test_sigint_reaches_the_whole_process_group(sim, tmp_path: Path) -> None:
    sim("server-8xa100")
    script = (
        "import subprocess, sys, time; "
        f"p = subprocess.Popen(['sleep', '30']); open({str(tmp_path / 'kid')!r}, 'w')"
        ".write(str(p.pid)); p.wait(); sys.exit(3)"
    )
    proc = popen("run", "-g", "1", "--", sys.executable, "-c", script)
    wait_for(lambda: (tmp_path / "kid").exists() and (tmp_path / "kid").read_text(), 10, "the kid")
    proc.send_signal(signal.SIGINT)
    # the grandchild (sleep) died of the forwarded SIGINT; python then exits 3
    assert proc.wait(10) in (3, 130)


def test_killed_job_frees_the_gpu_at_once(sim, cli, tmp_path: Path) -> None:
    sim("server-8xa100")
    proc, mark = hold(tmp_path, "a", "--gpus", "7")
    os.kill(int(Path(str(mark) + ".pid").read_text()), signal.SIGKILL)
    assert proc.wait(10) == 128 + 9
    t0 = time.monotonic()
    r = cli("run", "--gpus", "7", "--", "true")
    assert r.returncode == 0, r.stderr
    assert time.monotonic() - t0 < 5  # includes interpreter start on a busy CI box


def test_killed_wrapper_leaves_the_lease_with_the_job(sim, cli, tmp_path: Path) -> None:
    sim("server-8xa100")
    proc, mark = hold(tmp_path, "a", "--gpus", "7")
    job_pid = int(Path(str(mark) + ".pid").read_text())
    proc.send_signal(signal.SIGKILL)
    proc.wait(10)
    # the job still runs and still holds GPU 7
    [info] = lease.list_leases()
    assert info.pid == job_pid and info.index == 7
    r = cli("run", "--gpus", "7", "--", "true")
    assert r.returncode == lease.EXIT_BUSY
    Path(str(mark) + ".go").touch()  # let the job end (it is not our child: poll)
    wait_for(lambda: not _alive(job_pid), 10, "the job's end")
    t0 = time.monotonic()
    # leasable again within 1 s of the last holder dying
    held = allocation.acquire(_req(gpus=("7",)), snapshot=_snap, wait=True, timeout=1.0)
    assert time.monotonic() - t0 < 1.0
    held.release()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie (not reaped yet: its parent was killed) holds no descriptors
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().split(") ")[1][0] != "Z"
    except OSError:
        return False


def _req(**kw: Any) -> Any:
    from gpuwarden.placement.request import Request

    return Request(**kw)


def _snap() -> Any:
    from gpuwarden.machine.inventory import read_snapshot

    return read_snapshot()


def test_cpu_and_zero_gpus_hide_every_gpu(sim, cli, tmp_path: Path) -> None:
    sim("server-8xa100")
    for args in (("-g", "0"), ("--cpu",)):
        r = cli("run", *args, "--", sys.executable, "-c", env_dump(tmp_path))
        assert r.returncode == 0, r.stderr
        env = json.loads((tmp_path / "env.json").read_text())
        assert env["CUDA_VISIBLE_DEVICES"] == ""
        assert "GPUWARDEN_JOB" not in env
    assert (
        not [n for n in os.listdir(os.environ["GPUWARDEN_LEASE_DIR"]) if n.endswith(".lease")]
        if os.path.isdir(os.environ["GPUWARDEN_LEASE_DIR"])
        else True
    )


def test_dry_run_explains_every_other_gpu(sim, cli) -> None:
    sim("server-8xa100")
    r = cli("run", "-g", "1", "--dry-run", "--", "python", "train.py")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].startswith("would use GPU 7")
    assert "CUDA_VISIBLE_DEVICES=7" in lines[1]
    reasons = {line.split(":")[0].strip(): line for line in lines[2:]}
    assert set(reasons) == {f"GPU {i}" for i in range(7)}
    assert "busy" in reasons["GPU 0"]
    assert lease.list_leases() == []


def test_parent_visible_devices_limit_the_choice(sim, cli, tmp_path: Path) -> None:
    sim("server-8xa100")
    free_all()
    r = cli(
        "run",
        "-g",
        "1",
        "--",
        sys.executable,
        "-c",
        env_dump(tmp_path),
        env={"CUDA_VISIBLE_DEVICES": "2,3"},
    )
    assert r.returncode == 0, r.stderr
    env = json.loads((tmp_path / "env.json").read_text())
    assert env["CUDA_VISIBLE_DEVICES"] in ("2", "3")
    r = cli("run", "-g", "3", "--", "true", env={"CUDA_VISIBLE_DEVICES": "2,3"})
    assert r.returncode == 2
    assert "leaves only 2 GPUs visible" in r.stderr


def test_waiting_job_is_admitted_when_the_gpu_frees(sim, tmp_path: Path) -> None:
    sim("server-8xa100")
    first, mark = hold(tmp_path, "a", "--gpus", "7")
    second = popen("run", "--gpus", "7", "--wait", "--", "true")
    wait_for(
        lambda: any(n.endswith(".wait") for n in os.listdir(os.environ["GPUWARDEN_LEASE_DIR"])),
        10,
        "a waiter's ticket",
    )
    time.sleep(0.2)
    assert second.poll() is None  # still waiting
    Path(str(mark) + ".go").touch()
    assert first.wait(10) == 0
    assert second.wait(10) == 0
    err = second.stderr.read()
    assert "waiting for GPU 7 (1st in line)" in err
    assert "granted GPU 7" in err


def test_wait_for_what_never_fits_fails_at_once(sim, cli) -> None:
    sim("server-8xa100")
    t0 = time.monotonic()
    r = cli("run", "-g", "9", "--wait", "--", "true")
    assert r.returncode == 2
    assert "only 8 GPUs" in r.stderr
    r = cli("run", "--min-free", "100GiB", "--wait", "--", "true")
    assert r.returncode == 2
    assert "in total" in r.stderr
    assert time.monotonic() - t0 < 20


def test_wait_timeout(sim, cli, tmp_path: Path) -> None:
    sim("server-8xa100")
    first, mark = hold(tmp_path, "a", "--gpus", "7")
    try:
        r = cli("run", "--gpus", "7", "--wait", "--timeout", "0.5", "--", "true")
        assert r.returncode == lease.EXIT_BUSY
        assert "timed out after" in r.stderr
    finally:
        Path(str(mark) + ".go").touch()
        first.wait(10)


def test_shared_leases_export_the_memory_limit(sim, cli, tmp_path: Path) -> None:
    sim("server-8xa100")
    first, mark = hold(tmp_path, "a", "--gpus", "7", "--mem", "30GiB")
    try:
        r = cli(
            "run", "--gpus", "7", "--mem", "30GiB", "--", sys.executable, "-c", env_dump(tmp_path)
        )
        assert r.returncode == 0, r.stderr
        env = json.loads((tmp_path / "env.json").read_text())
        assert env["GPUWARDEN_MEM_LIMIT"] == str(30 * 2**30)
        assert env["GPUWARDEN_LEASE"] == "shared"
        r = cli("run", "--gpus", "7", "--mem", "60GiB", "--", "true")
        assert r.returncode == lease.EXIT_BUSY and "no room" in r.stderr
        r = cli("run", "--gpus", "7", "--", "true")  # exclusive: never shares
        assert r.returncode == lease.EXIT_BUSY
    finally:
        Path(str(mark) + ".go").touch()
        first.wait(10)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--min-free", "10XB"), "invalid min_free '10XB'"),
        (("-g", "x"), "invalid GPU count 'x'"),
        (("-g", "-1"), "invalid GPU count"),
        (("--gpus", "42"), "unknown GPU '42'"),
        (("--exclude", "GPU-zz"), "unknown GPU"),
        (("--max-util", "150"), "invalid max_util"),
        (("--min-capability", "eight"), "invalid min_capability"),
        (("--timeout", "5m"), "--timeout only applies with --wait"),
        (("--wait", "--timeout", "soon"), "invalid timeout"),
        (("--nproc", "2"), "--nproc only applies with --ddp"),
        (("--mem", "0"), "invalid --mem"),
        (("--cpu", "--mem", "1GiB"), "--mem asks for a share"),
        (("--cpu", "-g", "2"), "--cpu hides every GPU"),
    ],
)
def test_bad_input_is_one_clear_line(sim, cli, args: tuple[str, ...], message: str) -> None:
    sim("server-8xa100")
    r = cli("run", *args, "--", "true")
    assert r.returncode == 2, r.stderr
    assert r.stderr.startswith("gpuwarden run: ")
    assert message in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


def test_no_command_and_bad_parent_env(sim, cli) -> None:
    sim("server-8xa100")
    r = cli("run", "-g", "1")
    assert r.returncode == 2 and "no command given" in r.stderr
    r = cli("run", "-g", "1", "--", "true", env={"CUDA_VISIBLE_DEVICES": "0,0"})
    assert r.returncode == 2
    assert "CUDA_VISIBLE_DEVICES='0,0'" in r.stderr and "Traceback" not in r.stderr
    r = cli("run", "-g", "1", "--", "true", env={"GPUWARDEN_RUN_MIN_FREE": "lots"})
    assert r.returncode == 2 and "GPUWARDEN_RUN_MIN_FREE" in r.stderr


def test_a_configured_timeout_leaves_a_run_that_does_not_wait_alone(sim, cli) -> None:
    # A lab's [run] timeout (here from the environment, as from its system file) is how
    # long waiting may last; a run without --wait neither waits nor fails for it.
    sim("server-8xa100")
    r = cli("run", "-g", "1", "--", "true", env={"GPUWARDEN_RUN_TIMEOUT": "1s"})
    assert r.returncode == 0, r.stderr
    r = cli("run", "-g", "1", "--wait", "--", "true", env={"GPUWARDEN_RUN_TIMEOUT": "1s"})
    assert r.returncode == 0, r.stderr


def test_unsafe_lease_dir_is_refused(sim, cli, tmp_path: Path) -> None:
    sim("server-8xa100")
    d = tmp_path / "open"
    d.mkdir()
    d.chmod(0o777)
    r = cli("run", "-g", "1", "--", "true", env={"GPUWARDEN_LEASE_DIR": str(d)})
    assert r.returncode == 2
    assert "sticky" in r.stderr and str(d) in r.stderr


def test_nested_run_inside_a_job_uses_its_gpu(sim, cli, tmp_path: Path) -> None:
    sim("server-8xa100")
    inner = f"import os; open({str(tmp_path / 'inner')!r}, 'w').write(os.environ['GPUWARDEN_GPUS'])"
    outer = (
        "import os, subprocess, sys; "
        "sys.exit(subprocess.call([sys.executable, '-m', 'gpuwarden', 'run', '-g', '1', '--', "
        f"sys.executable, '-c', {inner!r}]))"
    )
    r = cli("run", "--gpus", "6", "--", sys.executable, "-c", outer)
    assert r.returncode == 0, r.stderr
    from gpuwarden.machine.inventory import read_snapshot

    gpu6 = next(g.uuid for g in read_snapshot().gpus if g.index == 6)
    assert (tmp_path / "inner").read_text() == gpu6


def test_waiters_are_served_in_arrival_order(sim, tmp_path: Path) -> None:
    sim("server-8xa100")
    first, mark = hold(tmp_path, "a", "--gpus", "7")
    log = tmp_path / "order"
    lease_dir = os.environ["GPUWARDEN_LEASE_DIR"]
    waiters = []
    try:
        for name in ("one", "two", "three"):
            waiters.append(
                popen("run", "--gpus", "7", "--wait", "--", "sh", "-c", f"echo {name} >> {log}")
            )
            n = len(waiters)
            wait_for(
                lambda n=n: sum(x.endswith(".wait") for x in os.listdir(lease_dir)) == n,
                10,
                f"{n} waiters' tickets",
            )
        Path(str(mark) + ".go").touch()
        for w in waiters:
            assert w.wait(20) == 0
        assert log.read_text().split() == ["one", "two", "three"]
    finally:
        Path(str(mark) + ".go").touch()
        first.wait(10)
        for w in waiters:
            if w.poll() is None:
                w.kill()


def test_without_a_driver_an_unspecified_count_runs_on_the_cpu(sim, cli) -> None:
    """The same `gpuwarden run -- python train.py` works on a laptop: documented fallback."""
    sim("laptop-none")
    out = cli("run", "--", "sh", "-c", 'echo "cvd=[$CUDA_VISIBLE_DEVICES]"')
    assert out.returncode == 0, out.stderr
    assert "cvd=[]" in out.stdout
    assert "the job runs with no GPU" in out.stderr
    asked = cli("run", "-g", "1", "--", "true")
    assert asked.returncode == 2
    assert "asked for 1 GPU but this machine has no GPUs" in asked.stderr


def test_run_hands_its_one_reading_of_the_configuration_down(
    sim, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`jobs.path.start` gets `run`'s reading of the configuration and hands it to all it
    calls: the lease directory, the drains and XID logs, the health rules. Nothing on
    the way reads the configuration again (issue 25: no reading kept for a block up the
    stack), so here the directories of the reading, not of the variables, are used."""
    from gpuwarden import config
    from gpuwarden.health import drain
    from gpuwarden.jobs.path import HeldJob, start
    from gpuwarden.machine.inventory import read_snapshot
    from gpuwarden.placement.request import Request

    sim("server-8xa100")  # GPUs 0-5 are busy with colleagues' jobs: 6 and 7 are free
    gpus = read_snapshot().gpus
    leases_here, state_here = tmp_path / "its-leases", tmp_path / "its-state"
    drain.drain(gpus[7].uuid, "in the reading's state directory", directory=state_here)
    conf = config.load(
        {"lease.dir": str(leases_here), "state.dir": str(state_here), "enforce.devices": "off"}
    )

    def reading_again(*_: object, **__: object) -> None:
        raise AssertionError("the configuration was read again below jobs.path.start")

    monkeypatch.setattr(config, "load", reading_again)
    out = tmp_path / "env.json"
    code = f"import json, os; json.dump(dict(os.environ), open({str(out)!r}, 'w'))"
    job = start(Request.from_config(conf), [sys.executable, "-c", code], conf)
    assert isinstance(job, HeldJob) and job.wait() == 0
    assert json.loads(out.read_text())["CUDA_VISIBLE_DEVICES"] == "6"  # 7 is drained there
    assert (leases_here / f"{gpus[6].uuid}.lock").exists()
    assert not os.path.lexists(os.environ["GPUWARDEN_LEASE_DIR"])
