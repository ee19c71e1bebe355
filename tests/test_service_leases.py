"""A service job's GPUs are held for exactly the job's life, whatever the job does.

The real service of tests/servicetools.py, as root, with real users' jobs: a job that
passes every descriptor it has to one of its owner's processes outside the job
(SCM_RIGHTS) keeps no GPU once it ends; and where the service has no cgroup to
hold a job (`enforce.devices = "off"`), a detached (setsid) child that ignores
SIGTERM ends with its job on cancel, at the time limit, and when the job's own
process exits, so no GPU stays held. The service leases as root for the job's
owner: `status` names the owner, a lease lasts the job's --time, and no user can
open (and so hold) a GPU's lock file in the service's lease directory.
"""

from __future__ import annotations

import fcntl
import json
import os
import select
import shutil
import signal
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuwarden import leases
from gpuwarden.service.identity import Person
from hermetic import hermetic
from repo import SRC
from servicetools import SPEC, USER_PY, Server, attached_again, become, cli_as, serving, submit
from users import make_user
from waiting import wait_for

LISTENER = textwrap.dedent("""\
    import os, socket, sys, time
    path, out = sys.argv[1], sys.argv[2]
    srv = socket.socket(socket.AF_UNIX)
    srv.bind(path)
    srv.listen(1)
    conn, _ = srv.accept()
    _, fds, _, _ = socket.recv_fds(conn, 16, 64)
    with open(out + ".tmp", "w") as fh:
        fh.write(str(len(fds)))
    os.rename(out + ".tmp", out)
    time.sleep(300)  # keeps every descriptor it was given
""")

PASSER = textwrap.dedent("""\
    import json, os, socket, sys, time
    path, ready, go = sys.argv[1], sys.argv[2], sys.argv[3]
    fds = [int(n) for n in os.listdir("/proc/self/fd")]
    targets = {}
    for fd in fds:
        try:
            targets[fd] = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            pass
    with open(ready, "w") as fh:
        json.dump(targets, fh)
    while not os.path.exists(go):
        time.sleep(0.01)
    sock = socket.socket(socket.AF_UNIX)
    sock.connect(path)
    socket.send_fds(sock, [b"x"], list(targets))
""")


def gpu_free(lease_dir: Path, uuid: str) -> bool:
    """Nobody holds the GPU's lock (root may open the 0600 lock file)."""
    fd = os.open(lease_dir / f"{uuid}.lock", os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        return False
    finally:
        os.close(fd)


def test_descriptors_a_job_passes_out_keep_no_gpu(server: Server) -> None:
    alice = make_user("alice", ("lab",))
    work = server.work
    (work.parent / "listener.py").write_text(LISTENER)
    (work.parent / "passer.py").write_text(PASSER)
    sock, got = work / "keeper.sock", work / "kept"
    ready, go = work / "ready.json", work / "go"
    keeper = subprocess.Popen(
        [USER_PY, str(work.parent / "listener.py"), str(sock), str(got)],
        preexec_fn=become(alice),
    )
    try:
        wait_for(sock.exists, 30, "alice's keeper to listen")
        job = submit(
            server, alice, [USER_PY, str(work.parent / "passer.py"), str(sock), str(ready), str(go)]
        )
        uuid = server.wait_state(job, ("RUNNING",))["gpus"][0]
        lease_dir = Path(os.environ["GPUWARDEN_LEASE_DIR"])
        wait_for(ready.exists, 30, "the job to pass its descriptors")
        # Held while the job runs, by the service's side of it, not by the job.
        assert [x.job for x in leases.list_leases(str(lease_dir)) if x.uuid == uuid] == [str(job)]
        assert not gpu_free(lease_dir, uuid)
        targets = json.loads(ready.read_text()).values()
        assert not [t for t in targets if t.startswith(str(lease_dir))], targets
        go.touch()
        assert server.wait_state(job, ("COMPLETED",))["state"] == "COMPLETED"
        # alice's process outside the job has all it was sent
        wait_for(got.exists, 30, "alice's keeper to get the descriptors")
        assert keeper.poll() is None
        assert gpu_free(lease_dir, uuid)
        assert not [x for x in leases.list_leases(str(lease_dir)) if x.uuid == uuid]
    finally:
        keeper.kill()
        keeper.wait(10)


@pytest.fixture
def uncontained(
    tmp_path: Path, open_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Server]:
    """The service without device cgroups: jobs are held by their process tree only."""
    conf = tmp_path / "system.toml"
    conf.write_text('[enforce]\ndevices = "off"\n')
    monkeypatch.setenv("GPUWARDEN_SYSTEM_CONFIG", str(conf))
    yield from serving(tmp_path, open_dir, monkeypatch)


DETACHER = (
    "setsid sh -c 'trap \"\" TERM; echo $$ > {pid}.tmp; mv {pid}.tmp {pid}; exec sleep 300' & "
    "{then}"
)


def test_a_detached_child_ignoring_sigterm_ends_with_its_job_without_cgroups(
    uncontained: Server,
) -> None:
    srv = uncontained
    alice = make_user("alice", ("lab",))
    lease_dir = Path(os.environ["GPUWARDEN_LEASE_DIR"])
    cases = {  # how the job ends -> what its main process does after detaching a child
        "cancel": "exec sleep 300",
        "time limit": "exec sleep 300",
        # Ends once the test holds its child (a pidfd): a job that ended first would
        # take the child with it before the test could name it.
        "exit": "while [ ! -e {pid}.go ]; do sleep 0.05; done",
    }
    jobs = {}
    for case, then in cases.items():
        pid = srv.work / f"{case.replace(' ', '-')}.pid"
        argv = ["sh", "-c", DETACHER.format(pid=pid, then=then.format(pid=pid))]
        extra = {"time_limit": 4} if case == "time limit" else {}
        jobs[case] = (submit(srv, alice, argv, **extra), pid)
    children = {}
    for case, (job, pid) in jobs.items():
        srv.wait_state(job, ("RUNNING", "COMPLETED"))
        wait_for(pid.exists, 30, f"the detached child's pid ({case})")
        child = int(pid.read_text())
        try:
            children[case] = os.pidfd_open(child)  # names the process, whatever reuses its pid
        except ProcessLookupError:
            # Already gone: only the time limit can have ended it this early (on a
            # loaded machine its 4 s pass while the others start); checked below.
            assert case == "time limit", f"{case}: the detached child died before its job ended"
            continue
        assert os.getsid(child) == child, "the child left the job's session"
    (srv.work / "exit.pid.go").touch()
    srv.call(alice, "cancel", jobs=[jobs["cancel"][0]])
    ended = {"cancel": "CANCELLED", "time limit": "TIMEOUT", "exit": "COMPLETED"}
    try:
        for case, (job, _) in jobs.items():
            row = srv.wait_state(job, (ended[case],), timeout=60)
            assert row["state"] == ended[case]
            if case in children:
                gone, _, _ = select.select([children[case]], [], [], 10)
                assert gone, f"{case}: the detached child outlived its job"
            assert gpu_free(lease_dir, row["gpus"][0]), case
    finally:
        for fd in children.values():
            os.close(fd)


HOLDER = textwrap.dedent("""\
    import json, sys
    import gpuwarden
    with gpuwarden.lease(n=1) as gpus:
        print(json.dumps({"job": gpus.job, "uuids": list(gpus.uuids), "cvd": gpus.visible}))
        sys.stdout.flush()
        sys.stdin.readline()  # the test says when the block ends
    print("done", flush=True)
""")


def readline(proc: subprocess.Popen[str], timeout: float = 60.0) -> str:
    """A line of `proc`'s output, or "" if none comes within `timeout` (no hang)."""
    assert proc.stdout is not None
    ready, _, _ = select.select([proc.stdout], [], [], timeout)
    return proc.stdout.readline() if ready else ""


def _holder(server: Server, alice: Person) -> tuple[subprocess.Popen[str], int, str]:
    """HOLDER run as `alice`, inside its block: the process, the job, its GPU."""
    script = server.work.parent / "holder.py"
    script.write_text(HOLDER)
    nvml = server.work.parent / "nvml"  # nvidia-ml-py, as a user of GPUs has it
    if not nvml.exists():
        nvml.mkdir()
        import pynvml

        shutil.copy(pynvml.__file__, nvml / "pynvml.py")
    env = {
        "PYTHONPATH": f"{SRC}:{nvml}",
        **hermetic(),
        "PATH": "/usr/bin:/bin",
        "GPUWARDEN_SOCKET": server.socket,
        "GPUWARDEN_SIM": SPEC,
        "GPUWARDEN_SIM_STATE": str(server.work / "sim"),
        "HOME": str(server.work),
    }
    holder = subprocess.Popen(
        [USER_PY, str(script)],
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=become(alice),
        cwd=str(server.work),
    )
    line = readline(holder)
    assert line, holder.communicate(timeout=30)[1]
    got = json.loads(line)
    if not got["uuids"]:
        holder.kill()
        raise AssertionError((got, holder.communicate(timeout=30)[1]))
    assert got["cvd"] in ("0", "1", "2", "3")
    return holder, int(got["job"]), got["uuids"][0]


def _end_block(holder: subprocess.Popen[str]) -> None:
    assert holder.stdin is not None
    holder.stdin.write("\n")
    holder.stdin.flush()
    assert readline(holder) == "done\n"
    assert holder.wait(30) == 0


def test_a_users_lease_in_python_is_held_through_the_service(server: Server) -> None:
    """`with gpuwarden.lease(n=1)` as a real user under a root service: held by the
    service, in `queue` as the user's running job, and free again after the block and
    after the holder is killed."""
    alice = make_user("alice", ("lab",))
    lease_dir = Path(os.environ["GPUWARDEN_LEASE_DIR"])
    ends = {}
    for how in ("block", "kill -9"):
        holder, job, uuid = _holder(server, alice)
        shown = cli_as(server, alice, "queue")
        mine = [r.split() for r in shown.stdout.splitlines() if r.split()[:1] == [str(job)]]
        assert mine and "gw-alice" in mine[0] and "RUNNING" in mine[0], shown.stdout
        assert not gpu_free(lease_dir, uuid)
        if how == "block":
            _end_block(holder)
        else:
            holder.kill()
            holder.wait(30)
        ends[how] = server.wait_state(job, ("COMPLETED", "CANCELLED"))["state"]
        wait_for(lambda u=uuid: gpu_free(lease_dir, u), 30, f"GPU {uuid} free after {how}")
    assert ends == {"block": "COMPLETED", "kill -9": "CANCELLED"}
    share = {u["user"]: u["usage"] for u in server.call(None, "share")["users"]}
    assert share.get("gw-alice", 0) > 0  # charged like any job


def test_a_users_lease_in_python_outlives_sigterm_and_sigkill_restarts(server: Server) -> None:
    """A restart of the service ends no allocation: the holder reconnects and attaches
    again after a SIGTERM and a SIGKILL restart, the job keeps running with its GPU,
    and the block's end still completes it."""
    alice = make_user("alice", ("lab",))
    lease_dir = Path(os.environ["GPUWARDEN_LEASE_DIR"])
    holder, job, uuid = _holder(server, alice)
    for times, sig in enumerate((signal.SIGTERM, signal.SIGKILL), start=1):
        server.kill(sig)
        server.start()
        attached_again(server, times)
        assert server.job(job)["state"] == "RUNNING"
        assert holder.poll() is None
    assert not gpu_free(lease_dir, uuid)
    _end_block(holder)
    assert server.wait_state(job, ("COMPLETED", "CANCELLED"))["state"] == "COMPLETED"
    wait_for(lambda: gpu_free(lease_dir, uuid), 30, f"GPU {uuid} free after the block")


def test_service_leases_name_the_owner_and_cannot_be_held_by_users(server: Server) -> None:
    """The service leases as root, for the job's owner: status names the owner, and no
    user can open (and so hold) a GPU's lock file in the service's directory."""
    alice, bob = make_user("alice", ("lab",)), make_user("bob")
    job = submit(server, alice, ["sleep", "60"], request={"count": 1})
    row = server.wait_state(job, ("RUNNING",))
    lease_dir = Path(os.environ["GPUWARDEN_LEASE_DIR"])
    lock = lease_dir / f"{row['gpus'][0]}.lock"
    assert lock.stat().st_mode & 0o777 == 0o600
    probe = subprocess.run(
        [USER_PY, "-c", f"open({str(lock)!r})"],
        preexec_fn=become(bob),
        capture_output=True,
        text=True,
    )
    assert probe.returncode != 0 and "Permission denied" in probe.stderr
    from gpuwarden import leases

    [mine] = [lease for lease in leases.list_leases(str(lease_dir)) if lease.job == str(job)]
    assert mine.user == "gw-alice"
    assert mine.expires is None  # no --time: the lease lasts as long as the job
    limited = submit(server, alice, ["sleep", "60"], request={"count": 1}, time_limit=600)
    server.wait_state(limited, ("RUNNING",))
    [timed] = [x for x in leases.list_leases(str(lease_dir)) if x.job == str(limited)]
    assert timed.expires is not None and 590 < timed.expires - timed.started <= 601
    shown = subprocess.run(
        [sys.executable, "-m", "gpuwarden", "status"],
        env=dict(os.environ, PYTHONPATH=str(SRC), GPUWARDEN_SIM=SPEC),
        capture_output=True,
        text=True,
        timeout=60,
    )
    leased = [x.split() for x in shown.stdout.splitlines() if x.startswith("GPU ")]
    [row] = [x for x in leased if x[3:4] == [str(limited)]]  # GPU n user job pid age ...
    assert row[2] == "gw-alice", shown.stdout
    expires_in = row[7]  # 10m00s, or a little less if the status came a moment later
    assert row[6] == "in" and (expires_in == "10m00s" or expires_in.startswith("9m")), shown.stdout
    server.call(None, "cancel", jobs=[job, limited])
    server.wait_state(job, ("CANCELLED",))
    server.wait_state(limited, ("CANCELLED",))
    assert not list(lease_dir.glob(f"*.{job}.lease"))
