"""Device isolation: the rules (pure), the detection, and real cgroups as root.

A device node made with `mknod` (major 195, a GPU's minor) tells the two apart
without a GPU: opening it fails with ENXIO where the cgroup allows it (no driver
behind it) and with EPERM where the cgroup denies it.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from components import require
from gpuwarden.base.errors import UserError
from gpuwarden.cgroups import accounting, devices, hierarchy
from gpuwarden.machine.inventory import read_snapshot
from gpuwarden.sim import Machine, specs
from repo import SRC
from waiting import wait_for

# --- pure --------------------------------------------------------------------------------------

minors = st.sets(st.integers(0, 253), max_size=16)


@given(leased=minors, present=minors)
def test_rules_deny_exactly_the_other_gpus(leased: set[int], present: set[int]) -> None:
    rules = devices.deny_rules(leased, present)
    denied = {int(r.split(":")[1].split()[0]) for r in rules}
    assert denied == present - leased
    assert all(r.startswith("c 195:") and r.endswith(" rwm") for r in rules)


def test_control_nodes_are_never_denied() -> None:
    assert devices.deny_rules([0], [0, 1, 254, 255]) == ["c 195:1 rwm"]
    with pytest.raises(ValueError):
        devices.deny_rules([255], [0])


def test_names_carry_the_wrapper_pid() -> None:
    name = devices.cgroup_name(123, "abc0")
    assert devices.owner_pid(name) == 123
    assert devices.owner_pid("someone-elses") is None
    with pytest.raises(ValueError):
        devices.cgroup_name(1, "../x")


MOUNTS_V1 = textwrap.dedent("""\
    tmpfs /sys/fs/cgroup tmpfs rw 0 0
    cgroup /sys/fs/cgroup/devices cgroup rw,relatime,devices 0 0
    cgroup /sys/fs/cgroup/cpu,cpuacct cgroup rw,cpu,cpuacct 0 0
    cgroup2 /sys/fs/cgroup/unified cgroup2 rw 0 0
""")
MOUNTS_V2 = "cgroup2 /sys/fs/cgroup cgroup2 rw,nsdelegate 0 0\n"
OWN = "5:devices:/\n3:cpu,cpuacct:/user.slice\n0::/\n"


def test_parsing_mounts_and_own_cgroups() -> None:
    assert hierarchy.v1_mounts(MOUNTS_V1)["devices"] == "/sys/fs/cgroup/devices"
    assert hierarchy.v1_mounts(MOUNTS_V1)["cpuacct"] == "/sys/fs/cgroup/cpu,cpuacct"
    assert hierarchy.v2_mount(MOUNTS_V2) == "/sys/fs/cgroup"
    assert hierarchy.own_paths(OWN) == {
        "devices": "/",
        "cpu": "/user.slice",
        "cpuacct": "/user.slice",
        "": "/",
    }


@pytest.mark.parametrize(
    "euid, mounts, own, pid1, mode, why",
    [
        (0, MOUNTS_V1, OWN, "init", "cgroup-v1", "devices controller"),
        (1000, MOUNTS_V1, OWN, "init", "none", "not root"),
        (0, MOUNTS_V1, "0::/\n", "init", "none", "no cgroup v1"),
        (0, MOUNTS_V2, "0::/\n", "systemd", "cgroup-v2-bpf", "delegated unit"),
        (0, MOUNTS_V2, "0::/\n", "bash", "cgroup-v2-bpf", "BPF device program"),
        (1000, MOUNTS_V2, "0::/\n", "bash", "none", "not root"),
        (0, "proc /proc proc rw 0 0\n", "", "init", "none", "no cgroup filesystem"),
        (
            0,
            MOUNTS_V1.replace("rw,relatime,devices", "ro,devices"),
            OWN,
            "init",
            "none",
            "read-only",
        ),
        (0, MOUNTS_V2.replace("rw,", "ro,"), "0::/\n", "bash", "none", "read-only"),
    ],
)
def test_judge_says_which_enforcement_and_why(euid, mounts, own, pid1, mode, why) -> None:
    got_mode, got_why = hierarchy.judge(euid, mounts, own, pid1)
    assert (got_mode, why in got_why) == (mode, True), got_why


# --- minor numbers on the simulated machine --------------------------------------------------


def test_simulated_minors_default_to_the_index(sim) -> None:
    sim("server-8xa100")
    assert [g.minor for g in read_snapshot().gpus] == list(range(8))


def test_a_spec_can_number_its_nodes(tmp_path: Path, monkeypatch) -> None:
    spec = tmp_path / "swapped.toml"
    spec.write_text('[[gpu]]\nmodel = "T4"\nminor = 1\n[[gpu]]\nmodel = "T4"\nminor = 0\n')
    monkeypatch.setenv("GPUWARDEN_SIM", str(spec))
    assert [(g.index, g.minor) for g in read_snapshot().gpus] == [(0, 1), (1, 0)]


@pytest.mark.parametrize(
    "text, message",
    [
        ("minor = 254", "expected an integer 0-253"),
        ('minor = "1"', "expected an integer 0-253"),
        ('minor = 0\n[[gpu]]\nmodel = "T4"\nminor = 0', "0 is used by two GPUs"),
    ],
)
def test_bad_minors_are_refused_with_the_field(tmp_path: Path, text: str, message: str) -> None:
    spec = tmp_path / "bad.toml"
    spec.write_text(f'[[gpu]]\nmodel = "T4"\n{text}\n')
    with pytest.raises(UserError, match="minor") as err:
        specs.load(str(spec))
    assert message in str(err.value)


# --- real cgroups (root, cgroup v1 devices) ----------------------------------------------------

PROBE = textwrap.dedent("""\
    import json, os, subprocess, sys, time
    nodes = sys.argv[1]
    def probe():
        res = {}
        for name in sorted(os.listdir(nodes)):
            try:
                os.close(os.open(os.path.join(nodes, name), os.O_RDWR))
                res[name] = "open"
            except OSError as err:
                res[name] = {1: "EPERM", 6: "ENXIO"}.get(err.errno, str(err.errno))
        return res
    if sys.argv[2:] == ["child"]:
        print(json.dumps(probe()))
        sys.exit()
    flag, out = sys.argv[2], sys.argv[3]
    open(out + ".ready", "w").close()
    deadline = time.monotonic() + 60
    while flag and not os.path.exists(flag) and time.monotonic() < deadline:
        time.sleep(0.01)
    child = subprocess.run([sys.executable, __file__, nodes, "child"], capture_output=True)
    json.dump({"job": probe(), "child": json.loads(child.stdout)}, open(out, "w"))
""")


@pytest.fixture
def nodes(tmp_path: Path, sim) -> Path:
    mode, why = hierarchy.detect()
    require(mode == "cgroup-v1", f"no device isolation here ({why})")
    sim("server-8xa100")
    machine = Machine.open()
    state = machine.state()
    busy = {state["gpus"][i]["uuid"] for i in (2, 5)}  # alice's and carol's
    for proc in state["processes"]:
        if proc["gpu"] in busy:
            machine.remove_process(proc["pid"])
    where = tmp_path / "dev"
    where.mkdir()
    for gpu in read_snapshot().gpus:
        os.mknod(where / f"nvidia{gpu.minor}", 0o666 | 0o020000, os.makedev(195, gpu.minor))
    (tmp_path / "job.py").write_text(PROBE)
    return where


def _run_job(tmp_path: Path, gpu: int, flag: str, name: str) -> tuple[subprocess.Popen[str], Path]:
    out = tmp_path / f"{name}.json"
    env = dict(os.environ, PYTHONPATH=str(SRC))
    cmd = [sys.executable, "-m", "gpuwarden", "run", "--gpus", str(gpu), "--"]
    cmd += [sys.executable, str(tmp_path / "job.py"), str(tmp_path / "dev"), flag, str(out)]
    return subprocess.Popen(cmd, env=env, text=True, stderr=subprocess.PIPE), out


def _wait_for(path: Path, proc: subprocess.Popen[str]) -> None:
    def there() -> bool:
        assert proc.poll() is None, proc.stderr.read() if proc.stderr else proc.returncode
        return path.exists()

    wait_for(there, 60, str(path))


def _expect(allowed: int) -> dict[str, str]:
    return {f"nvidia{m}": "ENXIO" if m == allowed else "EPERM" for m in range(8)}


def test_a_job_opens_only_its_gpu_and_its_children_inherit_it(nodes: Path, tmp_path: Path) -> None:
    proc, out = _run_job(tmp_path, 2, "", "alone")
    assert proc.wait(timeout=60) == 0, proc.stderr.read() if proc.stderr else ""
    seen = json.loads(out.read_text())
    assert seen["job"] == _expect(2)
    assert seen["child"] == _expect(2)
    # Outside any job, every node is allowed (ENXIO: no driver), and the cgroup is gone.
    for name in os.listdir(nodes):
        with pytest.raises(OSError) as err:
            os.open(nodes / name, os.O_RDWR)
        assert err.value.errno == 6
    assert not [n for n in _job_cgroups() if devices.owner_pid(n) == proc.pid]


def _job_cgroups() -> list[str]:
    own = hierarchy.own_paths(Path("/proc/self/cgroup").read_text())["devices"]
    parent = Path("/sys/fs/cgroup/devices") / own.lstrip("/") / "gpuwarden"
    return [p.name for p in parent.iterdir() if p.is_dir()] if parent.exists() else []


def test_two_jobs_on_other_gpus_do_not_touch_each_other(nodes: Path, tmp_path: Path) -> None:
    flag = tmp_path / "go"
    first, first_out = _run_job(tmp_path, 2, str(flag), "first")
    second, second_out = _run_job(tmp_path, 5, str(flag), "second")
    try:
        _wait_for(Path(str(first_out) + ".ready"), first)
        _wait_for(Path(str(second_out) + ".ready"), second)
        flag.touch()  # both are confined and running: now both look
        assert first.wait(timeout=60) == 0
        assert second.wait(timeout=60) == 0
    finally:
        for proc in (first, second):
            if proc.poll() is None:
                proc.kill()
    assert json.loads(first_out.read_text())["job"] == _expect(2)
    assert json.loads(second_out.read_text())["job"] == _expect(5)


def test_enforce_off_leaves_the_job_alone(nodes: Path, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("GPUWARDEN_ENFORCE_DEVICES", "off")
    proc, out = _run_job(tmp_path, 2, "", "off")
    assert proc.wait(timeout=60) == 0
    assert set(json.loads(out.read_text())["job"].values()) == {"ENXIO"}


def test_sweep_removes_only_empty_cgroups_of_dead_wrappers(tmp_path: Path) -> None:
    mode, why = hierarchy.detect()
    require(mode == "cgroup-v1", f"no device isolation here ({why})")
    parent = Path("/sys/fs/cgroup/devices") / f"gpuwarden-test-{os.getpid()}"
    parent.mkdir()
    try:
        dead = subprocess.run(
            [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
        ).stdout.strip()
        (parent / devices.cgroup_name(int(dead), "aa")).mkdir()
        (parent / devices.cgroup_name(os.getpid(), "bb")).mkdir()
        busy = parent / devices.cgroup_name(int(dead) + 0, "cc")
        busy.mkdir()
        sleeper = subprocess.Popen(
            [sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE
        )
        (busy / "cgroup.procs").write_text(str(sleeper.pid))
        try:
            removed = devices.sweep(str(parent))
        finally:
            sleeper.communicate("")
        assert removed == [devices.cgroup_name(int(dead), "aa")]
    finally:
        for child in parent.iterdir():
            if child.is_dir():
                child.rmdir()
        parent.rmdir()


def test_usage_and_processes_of_a_job(tmp_path: Path) -> None:
    mode, why = hierarchy.detect()
    require(mode == "cgroup-v1", f"no device isolation here ({why})")
    script = textwrap.dedent("""\
        import json, os, sys
        sys.path.insert(0, sys.argv[1])
        from gpuwarden.cgroups import accounting, devices
        iso = devices.prepare()
        iso.confine([0], [0, 1])
        x = sum(i * i for i in range(300000))
        held = b"x" * (8 << 20)  # written, so charged to the job's memory cgroup
        me = os.getpid()
        pids = accounting.pids_in(iso.dirs["devices"])
        print(json.dumps({"pids": pids, "usage": accounting.usage_of(iso.dirs),
                          "by_pid": accounting.usage(me), "me": me}))
        print(json.dumps(iso.close()))
    """)
    out = subprocess.run(
        [sys.executable, "-c", script, str(SRC)], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    first, closed = out.stdout.splitlines()
    data = json.loads(first)
    assert data["pids"] == [data["me"]]
    usage, by_pid = data["usage"], data["by_pid"]
    mode_dirs, _ = devices.dirs_for("x", "cgroup-v1")
    if "cpuacct" in mode_dirs:  # found from the pid, read a moment later: never less
        assert 0 < usage["cpu_ns"] <= by_pid["cpu_ns"]
    if "memory" in mode_dirs:
        assert 8 << 20 <= usage["memory"] <= usage["memory_peak"]
        assert by_pid["memory"] >= 8 << 20
    assert json.loads(closed) is True


def test_signal_job_reaches_every_process_of_the_job(tmp_path: Path) -> None:
    mode, why = hierarchy.detect()
    require(mode == "cgroup-v1", f"no device isolation here ({why})")
    # A job whose child double-forks away (a daemon) is still found through its cgroup.
    script = textwrap.dedent("""\
        import os, signal, subprocess, sys, time
        sys.path.insert(0, sys.argv[1])
        from gpuwarden.cgroups import accounting, devices
        iso = devices.prepare()
        iso.confine([0], [0, 1])
        job = subprocess.Popen([sys.executable, "-c",
            "import os, sys, time\\n"
            "if os.fork() == 0:\\n"
            "    os.setsid(); print(os.getpid(), flush=True); time.sleep(600)\\n"
            "time.sleep(600)"], stdout=subprocess.PIPE, text=True)
        daemon = int(job.stdout.readline())
        me = os.getpid()
        pids = lambda: sorted(accounting.pids_in(iso.dirs["devices"]))
        members = pids()
        assert members == sorted([me, job.pid, daemon]), (members, me, job.pid, daemon)
        os.write(1, b"%d\\n" % len(members))
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # the wrapper is in the job too
        sent = accounting.signal_job(job.pid, signal.SIGTERM)
        job.wait(timeout=60)
        deadline = time.monotonic() + 60
        while pids() != [me] and time.monotonic() < deadline:
            time.sleep(0.01)
        print(sent, pids() == [me], iso.close())
    """)
    out = subprocess.run(
        [sys.executable, "-c", script, str(SRC)], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["3", "3", "True", "True"]


def test_require_refuses_a_job_that_cannot_be_isolated() -> None:
    """As a user who is not root, `enforce.devices = require` refuses to start the job
    with one line; `auto` (the default) runs it as before."""
    require(os.geteuid() == 0, "needs root to run a command as another user")
    import shutil
    import tempfile

    work = Path(tempfile.mkdtemp(prefix="gpuwarden-nobody-"))  # pytest's own is root's only
    os.chmod(work, 0o1777)  # sticky, as /tmp: the lease directory checks it
    try:
        _run_as_nobody(work)
    finally:
        shutil.rmtree(work)


def _run_as_nobody(work: Path) -> None:
    from hermetic import hermetic

    env = {
        **hermetic(),  # never the machine's own service or config
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "PYTHONPATH": str(SRC),
        "GPUWARDEN_SIM": "server-8xa100",
        "GPUWARDEN_SIM_STATE": str(work / "sim"),
        "GPUWARDEN_LEASE_DIR": str(work / "leases"),
        "GPUWARDEN_STATE_DIR": str(work / "state"),
        "GPUWARDEN_SYSTEM_CONFIG": str(work / "none.toml"),
        "HOME": str(work),
    }
    as_nobody = ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups"]
    cmd = [*as_nobody, sys.executable, "-m", "gpuwarden", "run", "--gpus", "7", "--", "true"]
    out = subprocess.run(
        cmd,
        env=dict(env, GPUWARDEN_ENFORCE_DEVICES="require"),
        capture_output=True,
        text=True,
        cwd=work,
        timeout=60,
    )
    assert out.returncode == 2, out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "not root" in lines[0] and "enforce.devices = require" in lines[0]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=work, timeout=60)
    assert (out.returncode, out.stderr) == (0, ""), out.stderr


def _all_job_cgroups() -> list[str]:
    """Job cgroup names under every hierarchy `prepare` uses."""
    dirs, _ = devices.dirs_for("x", "cgroup-v1")
    names = []
    for path in dirs.values():
        parent = Path(path).parent
        names += [p.name for p in parent.iterdir() if p.is_dir()] if parent.exists() else []
    return names


def test_a_killed_wrappers_cgroups_go_with_the_next_run(nodes: Path, tmp_path: Path) -> None:
    env = dict(os.environ, PYTHONPATH=str(SRC))
    job = [sys.executable, "-c", "import sys; print('ready', flush=True); sys.stdin.read()"]
    wrapper = subprocess.Popen(
        [sys.executable, "-m", "gpuwarden", "run", "--gpus", "7", "--", *job],
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert wrapper.stdout is not None and wrapper.stdout.readline() == "ready\n"
    mine = [n for n in _all_job_cgroups() if devices.owner_pid(n) == wrapper.pid]
    assert len(mine) >= 1  # devices, and cpuacct/memory where mounted
    wrapper.kill()  # SIGKILL: no chance to tidy; the job lives on, confined, then ends
    wrapper.communicate("")
    wait_for(lambda: not any(accounting.pids_in(p) for p in _dirs_of(mine)), 60, "the job's end")
    assert [n for n in _all_job_cgroups() if devices.owner_pid(n) == wrapper.pid] == mine
    out = subprocess.run(
        [sys.executable, "-m", "gpuwarden", "run", "--gpus", "6", "--", "true"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    assert [n for n in _all_job_cgroups() if devices.owner_pid(n) == wrapper.pid] == []


def _dirs_of(names: list[str]) -> list[str]:
    dirs, _ = devices.dirs_for("x", "cgroup-v1")
    return [
        str(Path(p).parent / n)
        for p in dirs.values()
        for n in names
        if (Path(p).parent / n).exists()
    ]


def test_a_run_inside_a_job_leaves_nothing_behind(nodes: Path) -> None:
    env = dict(os.environ, PYTHONPATH=str(SRC))
    inner = [sys.executable, "-m", "gpuwarden", "run", "-g", "1", "--", "true"]
    outer = subprocess.Popen(
        [sys.executable, "-m", "gpuwarden", "run", "--gpus", "7", "--", *inner],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    _, err = outer.communicate(timeout=60)
    assert outer.returncode == 0, err
    # The outer wrapper removed its cgroup although the inner run made a group inside it.
    assert [n for n in _all_job_cgroups() if devices.owner_pid(n) == outer.pid] == []


@pytest.mark.parametrize("found", ["cgroup-v1", "none"])
def test_auto_runs_the_job_anyway_and_says_so_only_when_it_should_have_worked(
    monkeypatch, capsys, found: str
) -> None:
    def fail(mode=None):
        raise devices.CgroupError("cannot create a device cgroup: Permission denied")

    monkeypatch.setattr(devices, "prepare", fail)
    monkeypatch.setattr(devices, "detect", lambda: (found, "facts"))
    assert devices.isolate("auto") == []
    err = capsys.readouterr().err
    if found == "none":
        assert err == ""
    else:
        assert err.count("\n") == 1 and "Permission denied; the job runs without it" in err
    with pytest.raises(UserError, match=r"enforce\.devices = require"):
        devices.isolate("require")


def test_a_polite_signal_reaches_each_process_once_and_sigkill_those_forked_meanwhile(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A job's SIGTERM handler may start a process in answer (`podman stop`, a checkpoint's
    upload): it must not get the SIGTERM too. SIGKILL follows processes forked meanwhile."""
    for signum, reached in ((signal.SIGTERM, [101]), (signal.SIGKILL, [101, 102])):
        listings = iter([[101], [101, 102], [101, 102]])
        monkeypatch.setattr(accounting, "pids_in", lambda _where, it=listings: next(it))
        sent: list[tuple[int, int]] = []
        monkeypatch.setattr(os, "kill", lambda pid, sig, s=sent: s.append((pid, sig)))
        assert accounting.signal_dirs({"devices": "/job"}, signum) == len(reached)
        assert sent == [(pid, signum) for pid in reached]
