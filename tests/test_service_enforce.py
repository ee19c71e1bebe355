"""Enforcement for the queue service's jobs, for real: device cgroups, signals, accounting.

The service runs as root with real users (see tests/servicetools.py). Device isolation is
told apart without a GPU by nodes made with `mknod` (major 195, a GPU's minor):
opening one gives ENXIO where the job's cgroup allows it (no driver behind it) and
EPERM where the cgroup denies it.
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

from components import require
from gpuwarden.cgroups import hierarchy
from servicetools import SPEC, USER_PY, Server, cli_as, submit
from users import make_user
from waiting import wait_for

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


@pytest.fixture
def nodes(server: Server) -> Path:
    mode, why = hierarchy.detect()
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
    from gpuwarden.service.jobcgroup import job_dirs, scope_of

    scope = scope_of(os.path.join(server.state, "jobs"))
    assert job_dirs(scope, str(first)) == {} and job_dirs(scope, str(second)) == {}


ESCAPE = (
    "import os, subprocess, sys\n"
    # A child in a session of its own, out of the job's process group: it tells when
    # SIGTERM reaches it, or ignores it (stubborn) and must then get SIGKILL.
    "child = sys.argv[3] if sys.argv[2] == 'polite' else \"trap '' TERM; exec sleep 300\"\n"
    "p = subprocess.Popen(['sh', '-c', child], start_new_session=True)\n"
    "open(sys.argv[1] + '.tmp', 'w').write(str(p.pid))\n"
    "os.rename(sys.argv[1] + '.tmp', sys.argv[1])\n"
    # The job itself outlives SIGTERM until its child has ended: the child's answer to
    # SIGTERM is never cut short by the end of the job (which kills what is left).
    "import signal; signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
    "p.wait()\n"
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
    mode, why = hierarchy.detect()
    require(mode != "none", f"no job cgroups here ({why})")
    alice = make_user("alice", ("lab",))
    pidfile = server.work / f"escaped-{how.replace(' ', '-')}"
    termed = server.work / "termed"
    polite = f"trap 'echo TERM > {termed}; exit 0' TERM; while :; do sleep 0.05; done"
    extra = {"time_limit": 1.0} if how == "time limit" else {}
    job = submit(server, alice, [USER_PY, "-c", ESCAPE, str(pidfile), child, polite], **extra)
    wait_for(pidfile.exists, 30, lambda: f"the pid file; the log: {server.log.read_text()[-2000:]}")
    escaped = int(pidfile.read_text())
    assert os.getsid(escaped) == escaped  # it did leave the job's session and group
    if how == "cancel":
        assert server.call(alice, "cancel", jobs=[job]).get("ok"), "cancel refused"
    row = server.wait_state(job, ("CANCELLED", "TIMEOUT"), timeout=60)
    assert row["state"] == ("CANCELLED" if how == "cancel" else "TIMEOUT")
    wait_for(lambda: _gone(escaped), 30, f"{escaped} gone after the {how}")
    if child == "polite":  # SIGTERM first, to every process: a chance to save its work
        wait_for(termed.exists, 10, "the SIGTERM's mark")
        assert termed.read_text() == "TERM\n"


def test_cpu_and_peak_memory_are_recorded_and_shown(server: Server) -> None:
    mode, why = hierarchy.detect()
    require(mode == "cgroup-v1", f"no job cgroups here ({why})")
    mounts = Path("/proc/self/mounts").read_text()
    require("cpuacct" in hierarchy.v1_mounts(mounts), "no cpuacct controller mounted")
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
    wait_for(flag.exists, 30, lambda: f"the job's flag; the log: {server.log.read_text()[-2000:]}")
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
    mode, why = hierarchy.detect()
    require(mode != "none", f"no job cgroups here ({why})")
    from gpuwarden.service.jobcgroup import job_dirs, place, placed_dirs, scope_of

    alice = make_user("alice", ("lab",))
    flag, ready = server.work / "end", server.work / "ready"
    wait = f"touch {ready}; while [ ! -e {flag} ]; do sleep 0.05; done"
    job = submit(server, alice, ["sh", "-c", wait])
    wait_for(ready.exists, 30, lambda: f"the job ready; the log: {server.log.read_text()[-2000:]}")
    scope = scope_of(os.path.join(server.state, "jobs"))
    assert job_dirs(scope, str(job), mode) != {}  # made for it, while it runs
    # Where the service finds them at the end, from its kept place (no /proc reads).
    exits_dir = os.path.join(server.state, "jobs")
    assert placed_dirs(place(exits_dir), str(job)) == job_dirs(scope, str(job), mode)
    server.kill(signal.SIGKILL)
    flag.touch()
    exits = Path(server.state) / "jobs" / f"{job}.exit"
    wait_for(exits.exists, 30, "the job's end")
    server.start()
    assert server.wait_state(job, ("COMPLETED",))["state"] == "COMPLETED"
    assert job_dirs(scope, str(job), mode) == {}


# --- the enforcement watcher in the service ----------------------------------------------------


@pytest.fixture
def watched(tmp_path: Path, open_dir: Path, monkeypatch: pytest.MonkeyPatch):
    """A service whose watcher looks at every tick (the default waits 5 s between looks)."""
    make_user("alice", ("lab",))
    make_user("bob")
    leases = open_dir / "leases"
    leases.mkdir(mode=0o755)
    monkeypatch.setenv("GPUWARDEN_LEASE_DIR", str(leases))
    monkeypatch.setenv("GPUWARDEN_ENFORCE_POLL_SECONDS", "0.1")
    monkeypatch.setenv("GPUWARDEN_SIM", SPEC)
    sendmail = tmp_path / "sendmail"  # the owner's notifications land in tmp_path/mail
    sendmail.write_text(f"#!/bin/sh\ncat >> {tmp_path / 'mail'}\n")
    sendmail.chmod(0o755)
    monkeypatch.setenv("GPUWARDEN_SERVICE_SENDMAIL", str(sendmail))
    srv = Server(tmp_path, open_dir / "work", ("--grace", "1s"))
    srv.start()
    yield srv
    if srv.proc and srv.proc.poll() is None:
        srv.kill(signal.SIGTERM)
    srv.kill_jobs()


def test_unreserved_use_is_shown_charged_and_exported(watched: Server) -> None:
    from gpuwarden.sim import Machine

    bob = make_user("bob")
    stray = subprocess.Popen(["sleep", "300"])  # bob's `python train.py`, without a lease
    try:
        Machine.open().add_process(1, stray.pid, "2GiB", user="gw-bob")
        found = wait_for(lambda: watched.call(None, "queue").get("unleased"), 30, "unleased use")
        assert [(r["user"], r["index"], r["pid"]) for r in found] == [("gw-bob", 1, stray.pid)]
        header = cli_as(watched, bob, "queue").stdout.splitlines()[0]
        assert header.startswith("unreserved: GPU 1 used by gw-bob"), header

        def usage() -> float:
            users = watched.call(None, "share")["users"]
            return next((u["usage"] for u in users if u["user"] == "gw-bob"), 0.0)

        wait_for(lambda: usage() >= 1.0, 30, "unreserved use charged")
        stats = watched.call(None, "stats")
        counted = {(r["policy"], r["action"]): r["count"] for r in stats["enforcement"]}
        assert counted.get(("unleased", "notify")) == 1  # once, not at every look
        from gpuwarden.exporter.queue import families

        names = {f.name: f for f in families(stats, "h")}
        assert names["gpuwarden_enforcement_actions"].samples[0].value == 1
        gauge = names["gpuwarden_unleased_processes"].samples
        assert [(s.labels["user"], s.labels["gpu"], s.value) for s in gauge] == [
            ("gw-bob", "1", 1.0)
        ]
    finally:
        stray.kill()
        stray.wait()


def test_a_memory_warning_goes_into_the_jobs_output_as_its_owner(watched: Server) -> None:
    from gpuwarden.sim import Machine

    alice = make_user("alice", ("lab",))
    out = watched.work / "alice.out"
    ready = watched.work / "ready"
    job = submit(
        watched,
        alice,
        ["sh", "-c", f"echo started; touch {ready}; exec sleep 300"],
        request={"count": 1, "mem": 1 << 30},
        output=str(out),
    )
    row = watched.wait_state(job, ("RUNNING",))
    wait_for(ready.exists, 30, "the job ready")
    # The job uses 4 GiB of the 1 GiB it declared.
    pid = watched.pid_of(job)
    Machine.open().add_process(row["indices"][0], pid, "4GiB", user="gw-alice")
    wait_for(
        lambda: "memory warn" in out.read_text(), 30, lambda: f"the warning in {out.read_text()!r}"
    )
    text = out.read_text()
    assert text.startswith("started\n") and "over its --mem 1.0GiB" in text
    assert os.stat(out).st_uid == alice.uid  # still the owner's file
    mailbox = watched.root / "mail"  # and the owner is told through the notifier
    wait_for(lambda: mailbox.exists() and "memory warn" in mailbox.read_text(), 30, "the mail")
    mail = mailbox.read_text()
    assert "To: gw-alice" in mail and f"Subject: gpuwarden job {job} memory warn" in mail
    watched.call(None, "cancel", jobs=[job])
    watched.wait_state(job, ("CANCELLED",))


def test_unleased_use_by_a_job_is_told_in_its_output(watched: Server) -> None:
    """Issue 23: a service job using a GPU outside its lease was reported by pid only;
    it is tied to the job and written to its output, as --mem over-use is."""
    from gpuwarden.sim import Machine

    alice = make_user("alice", ("lab",))
    out = watched.work / "stray.out"
    child = watched.work / "stray-child"  # the job's python, started by its shell
    job = submit(
        watched,
        alice,
        [
            "sh",
            "-c",
            f"echo started; sleep 300 & echo $! > {child}.tmp; mv {child}.tmp {child}; wait",
        ],
        request={"count": 1},
        output=str(out),
    )
    row = watched.wait_state(job, ("RUNNING",))
    wait_for(child.exists, 30, "the child's pid file")
    pid = int(child.read_text())
    assert watched.pid_of(job) != pid  # not the lease's holder: found by its ancestry
    other = next(i for i in range(4) if i not in row["indices"])  # not its GPU
    Machine.open().add_process(other, pid, "2GiB", user="gw-alice")
    wait_for(
        lambda: "unleased" in out.read_text(), 30, lambda: f"the notice in {out.read_text()!r}"
    )
    assert os.stat(out).st_uid == alice.uid
    watched.call(None, "cancel", jobs=[job])
    watched.wait_state(job, ("CANCELLED",))


def test_appending_as_the_owner_never_follows_their_symlink_as_root(tmp_path: Path) -> None:
    from gpuwarden.service import store as st
    from gpuwarden.service.watching import append_as

    alice = make_user("alice", ("lab",))
    secret = tmp_path / "root-only"
    secret.write_text("root's\n")
    secret.chmod(0o600)
    home = tmp_path / "home"
    home.mkdir()
    home.chmod(0o777)
    (home / "out").symlink_to(secret)
    job = st.new_job(
        uid=alice.uid,
        gid=alice.gid,
        user="gw-alice",
        argv=("true",),
        cwd=str(home),
        env={},
        umask=0o22,
        request={},
        state=st.RUNNING,
        submitted=0.0,
        output=str(home / "out"),
    )
    tmp_path.chmod(0o755)
    assert append_as(job, "warned\n") is False
    assert secret.read_text() == "root's\n"
    (home / "out").unlink()
    os.mkfifo(home / "out")  # a FIFO nobody reads: refused at once, never waited on
    assert append_as(job, "warned\n", timeout=10) is False


def test_the_acceptance_check_of_device_isolation_on_a_simulated_machine(tmp_path: Path) -> None:
    mode, why = hierarchy.detect()
    require(mode == "cgroup-v1", f"no device isolation here ({why})")
    from acceptance import FAKE_SMI, run_script

    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "nvidia-smi").write_text(FAKE_SMI.format(python=sys.executable))
    (bindir / "nvidia-smi").chmod(0o755)
    dev = tmp_path / "dev"
    dev.mkdir()
    for minor in range(4):
        os.mknod(dev / f"nvidia{minor}", 0o600 | 0o020000, os.makedev(195, minor))
    results = {}
    for spec in (SPEC, "h200"):
        env = {"GPU_ACCEPTANCE_SIM": spec, "GPUWARDEN_SIM": spec, "GPU_ACCEPTANCE_DEV": str(dev)}
        out = tmp_path / f"out-{len(results)}"
        run_script(
            "--only", "service-device", path=f"{bindir}:{os.environ['PATH']}", env=env, out=out
        )
        record = json.loads((out / "gpu-acceptance.json").read_text())
        results[spec] = next(r for r in record["results"] if r["name"].startswith("service-"))
    four = results[SPEC]
    assert four["status"] == "PASS", four
    assert "3 other node(s) EPERM" in four["detail"]
    assert results["h200"]["status"] == "SKIP" and "needs two GPUs" in results["h200"]["detail"]


def test_two_services_never_share_or_sweep_each_others_job_cgroups(tmp_path: Path) -> None:
    mode, why = hierarchy.detect()
    require(mode == "cgroup-v1", f"no device isolation here ({why})")
    from gpuwarden.service import jobcgroup

    first, second = (jobcgroup.scope_of(str(tmp_path / n)) for n in ("one", "two"))
    assert first != second and first == jobcgroup.scope_of(str(tmp_path / "one"))
    places = [jobcgroup.place(str(tmp_path / n)) for n in ("one", "two")]
    made = [jobcgroup.make_job(p, "1", [0], [0, 1]) for p in places]
    try:
        assert made[0]["devices"] != made[1]["devices"]
        assert set(jobcgroup.service_jobs(first)) == {"1"}
        assert jobcgroup.service_jobs(first)["1"] == made[0]
    finally:
        assert all(jobcgroup.remove_job(d) for d in made)
        for scope in (first, second):  # as a stopped service does: no trail left
            jobcgroup.remove_scope(scope)
    assert jobcgroup.service_jobs(first) == {} and jobcgroup.service_jobs(second) == {}


def test_a_job_joins_its_cgroup_through_tasks_and_its_children_follow(tmp_path: Path) -> None:
    """The job's child moves its one thread in through v1's `tasks` (the cheap move that
    skips the whole-process lock); what it starts afterwards is in the cgroup too."""
    mode, why = hierarchy.detect()
    require(mode == "cgroup-v1", f"no device isolation here ({why})")
    from gpuwarden.service import jobcgroup

    scope = jobcgroup.scope_of(str(tmp_path))
    dirs = jobcgroup.make_job(jobcgroup.place(str(tmp_path)), "7", [0], [0, 1])
    try:
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the child reports through the pipe
            try:
                os.close(read)
                jobcgroup.join(dirs)
                child = subprocess.run(["cat", "/proc/self/cgroup"], capture_output=True)
                os.write(write, child.stdout)
            finally:
                os._exit(0)
        os.close(write)
        seen = b""
        while chunk := os.read(read, 65536):
            seen += chunk
        os.close(read)
        os.waitpid(pid, 0)
        lines = {
            controller: where
            for _, controllers, where in (line.split(":", 2) for line in seen.decode().split())
            for controller in controllers.split(",")
        }
        for controller, path in dirs.items():
            assert path.endswith(lines[controller]), (controller, lines)
    finally:
        assert jobcgroup.remove_job(dirs)
        jobcgroup.remove_scope(scope)


def test_a_stopped_service_leaves_no_cgroup_directory(server: Server) -> None:
    mode, why = hierarchy.detect()
    require(mode == "cgroup-v1", f"no job cgroups here ({why})")
    from gpuwarden.service import jobcgroup

    alice = make_user("alice", ("lab",))
    job = submit(server, alice, ["true"], request={"gpus": ["1"]})
    assert server.wait_state(job, ("COMPLETED",))["state"] == "COMPLETED"
    scope = jobcgroup.scope_of(os.path.join(server.state, "jobs"))
    parents = {os.path.dirname(p) for p in jobcgroup.job_dirs(scope, "0", existing=False).values()}
    assert parents and any(os.path.isdir(p) for p in parents)  # made for the job
    server.kill(signal.SIGTERM)
    assert not any(os.path.isdir(p) for p in parents)
