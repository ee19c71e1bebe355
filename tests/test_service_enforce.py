"""Enforcement for the queue service's jobs, for real: device cgroups, signals, accounting.

The service runs as root with real users (see test_service.py). Device isolation is
told apart without a GPU by nodes made with `mknod` (major 195, a GPU's minor):
opening one gives ENXIO where the job's cgroup allows it (no driver behind it) and
EPERM where the cgroup denies it.
"""

from __future__ import annotations

import json
import os
import signal
import textwrap
import time
from pathlib import Path

import pytest

import test_service
from conftest import require
from gpuwarden import cgroups
from test_service import USER_PY, Server, cli_as, submit
from users import make_user

# The real service of test_service.py, as its tests get it.
open_dir = test_service.open_dir
server = test_service.server

PROBE = textwrap.dedent("""\
    import json, os, subprocess, sys, time
    nodes, out, flag = sys.argv[1], sys.argv[2], sys.argv[3]
    def probe():
        res = {}
        for name in sorted(os.listdir(nodes)):
            try:
                os.close(os.open(os.path.join(nodes, name), os.O_RDWR))
                res[name] = "open"
            except OSError as err:
                res[name] = {1: "EPERM", 6: "ENXIO"}.get(err.errno, str(err.errno))
        return res
    if out == "child":
        print(json.dumps(probe()))
        sys.exit()
    deadline = time.monotonic() + 60
    while flag != "-" and not os.path.exists(flag) and time.monotonic() < deadline:
        time.sleep(0.01)
    child = subprocess.run(
        [sys.executable, __file__, nodes, "child", "-"], capture_output=True, check=True
    )
    with open(out + ".tmp", "w") as fh:
        json.dump({"job": probe(), "child": json.loads(child.stdout)}, fh)
    os.rename(out + ".tmp", out)
""")


def _poll(what, timeout: float = 30.0):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while True:
        value = what()
        if value or time.monotonic() > deadline:
            return value
        time.sleep(0.02)


@pytest.fixture
def nodes(server: Server) -> Path:
    mode, why = cgroups.detect()
    require(mode == "cgroup-v1", f"no device isolation here ({why})")
    where = server.work.parent / "dev"
    where.mkdir()
    where.chmod(0o755)
    for minor in range(4):  # idle-4xa100.toml: minors default to the indices
        os.mknod(where / f"nvidia{minor}", 0o666 | 0o020000, os.makedev(195, minor))
        (where / f"nvidia{minor}").chmod(0o666)  # past the umask: only the cgroup may deny
    (server.work.parent / "probe.py").write_text(PROBE)
    (server.work.parent / "probe.py").chmod(0o644)
    return where


def _expect(allowed: int) -> dict[str, str]:
    return {f"nvidia{m}": "ENXIO" if m == allowed else "EPERM" for m in range(4)}


def test_a_job_opens_only_its_leased_gpu_and_so_do_its_children(
    server: Server, nodes: Path
) -> None:
    alice, bob = make_user("alice", ("lab",)), make_user("bob")
    probe = str(server.work.parent / "probe.py")
    flag = server.work / "go"
    out_a, out_b = server.work / "alice.json", server.work / "bob.json"
    first = submit(
        server, alice, [USER_PY, probe, str(nodes), str(out_a), str(flag)], request={"gpus": ["2"]}
    )
    assert server.wait_state(first, ("RUNNING",))["indices"] == [2]
    # bob's job on another GPU runs beside alice's, confined to its own GPU only.
    second = submit(
        server, bob, [USER_PY, probe, str(nodes), str(out_b), "-"], request={"gpus": ["0"]}
    )
    assert server.wait_state(second, ("COMPLETED",))["indices"] == [0]
    flag.touch()
    assert server.wait_state(first, ("COMPLETED",))["state"] == "COMPLETED"
    got_a, got_b = json.loads(out_a.read_text()), json.loads(out_b.read_text())
    assert got_a == {"job": _expect(2), "child": _expect(2)}
    assert got_b == {"job": _expect(0), "child": _expect(0)}
    # Removed when the jobs ended: nothing of theirs is left in the cgroup tree.
    from gpuwarden.service.jobcgroup import job_dirs

    assert job_dirs(str(first)) == {} and job_dirs(str(second)) == {}


ESCAPE = (
    "import os, subprocess, sys\n"
    # A child in a session of its own, out of the job's process group: it tells when
    # SIGTERM reaches it, or ignores it (stubborn) and must then get SIGKILL.
    "child = sys.argv[3] if sys.argv[2] == 'polite' else \"trap '' TERM; exec sleep 300\"\n"
    "p = subprocess.Popen(['sh', '-c', child], start_new_session=True)\n"
    "open(sys.argv[1] + '.tmp', 'w').write(str(p.pid))\n"
    "os.rename(sys.argv[1] + '.tmp', sys.argv[1])\n"
    "os.execvp('sleep', ['sleep', '300'])\n"
)


def _gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


@pytest.mark.parametrize("how", ["cancel", "time limit"])
@pytest.mark.parametrize("child", ["polite", "stubborn"])
def test_cancel_and_time_limits_reach_a_child_that_left_the_group(
    server: Server, how: str, child: str
) -> None:
    mode, why = cgroups.detect()
    require(mode != "none", f"no job cgroups here ({why})")
    alice = make_user("alice", ("lab",))
    pidfile = server.work / f"escaped-{how.replace(' ', '-')}"
    termed = server.work / "termed"
    polite = f"trap 'echo TERM > {termed}; exit 0' TERM; while :; do sleep 0.05; done"
    extra = {"time_limit": 1.0} if how == "time limit" else {}
    job = submit(server, alice, [USER_PY, "-c", ESCAPE, str(pidfile), child, polite], **extra)
    assert _poll(pidfile.exists), server.log.read_text()[-2000:]
    escaped = int(pidfile.read_text())
    assert os.getsid(escaped) == escaped  # it did leave the job's session and group
    if how == "cancel":
        assert server.call(alice, "cancel", jobs=[job]).get("ok"), "cancel refused"
    row = server.wait_state(job, ("CANCELLED", "TIMEOUT"), timeout=60)
    assert row["state"] == ("CANCELLED" if how == "cancel" else "TIMEOUT")
    assert _poll(lambda: _gone(escaped), 30), f"{escaped} escaped the {how}"
    if child == "polite":  # SIGTERM first, to every process: a chance to save its work
        assert _poll(termed.exists, 10) and termed.read_text() == "TERM\n"


def test_cpu_and_peak_memory_are_recorded_and_shown(server: Server) -> None:
    mode, why = cgroups.detect()
    require(mode == "cgroup-v1", f"no job cgroups here ({why})")
    mounts = Path("/proc/self/mounts").read_text()
    require("cpuacct" in cgroups.v1_mounts(mounts), "no cpuacct controller mounted")
    alice = make_user("alice", ("lab",))
    flag = server.work / "burned"
    burn = (
        "import os, sys, time\n"
        "block = bytearray(64 << 20)\n"  # 64 MiB, touched
        "t = time.process_time()\n"
        "while time.process_time() - t < 0.5: pass\n"
        "open(sys.argv[1], 'w').close()\n"
        "time.sleep(300)\n"
    )
    job = submit(server, alice, [USER_PY, "-c", burn, str(flag)])
    assert _poll(flag.exists), server.log.read_text()[-2000:]
    running = server.job(job)
    assert running["cpu_seconds"] >= 0.4 and running["mem_peak"] >= 64 << 20, running
    queue = cli_as(server, alice, "queue")
    assert "CPU" in queue.stdout and "PEAKMEM" in queue.stdout, queue.stdout
    server.call(alice, "cancel", jobs=[job])
    row = server.wait_state(job, ("CANCELLED",))
    assert row["cpu_seconds"] >= 0.4 and row["mem_peak"] >= 64 << 20, row
    history = cli_as(server, alice, "jobs")
    lines = [x for x in history.stdout.splitlines() if x.split()[:1] == [str(job)]]
    assert len(lines) == 1 and "MiB" in lines[0], history.stdout + history.stderr


def test_a_job_that_ended_while_the_service_was_down_leaves_no_cgroup(server: Server) -> None:
    mode, why = cgroups.detect()
    require(mode != "none", f"no job cgroups here ({why})")
    from gpuwarden.service.jobcgroup import job_dirs

    alice = make_user("alice", ("lab",))
    flag, ready = server.work / "end", server.work / "ready"
    wait = f"touch {ready}; while [ ! -e {flag} ]; do sleep 0.05; done"
    job = submit(server, alice, ["sh", "-c", wait])
    assert _poll(ready.exists), server.log.read_text()[-2000:]
    assert job_dirs(str(job), mode) != {}  # made for it, while it runs
    server.kill(signal.SIGKILL)
    flag.touch()
    exits = Path(server.state) / "jobs" / f"{job}.exit"
    assert _poll(exits.exists), "the job did not end"
    server.start()
    assert server.wait_state(job, ("COMPLETED",))["state"] == "COMPLETED"
    assert job_dirs(str(job), mode) == {}
