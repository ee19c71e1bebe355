"""Crash safety of the queue service under load (issue 12, "Done when").

Three real users submit 1,000 short jobs while the service is `kill -9`ed and
started again at random moments, at least 20 times. Afterwards:

- every submitted job ran exactly once (its start line appears once in its owner's
  log, under the id the service gave it) and no other job ran;
- no two jobs ever shared a GPU, except jobs that both declared `mem` and fit
  together (intervals recorded by the jobs themselves with `date +%s%N`);
- no running job was killed by a restart: every job ended COMPLETED with exit 0;
- attached jobs (`gpuwarden run` through the service) among them outlive the kills
  too: each client exits with its job's status, and a submit whose answer a kill
  lost (the client submits again) left a copy that never ran.

The moments of the kills and the mix of jobs come from one seed, printed at the
start and in every failure: `GPUWARDEN_STRESS_SEED=N pytest -k stress` replays it.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any, Optional

import pytest

from gpuwarden.service import store as st
from hermetic import hermetic
from servicetools import become
from users import make_user
from waiting import wait_for

SRC = str(Path(__file__).resolve().parent.parent / "src")
SPEC = str(Path(__file__).resolve().parent / "data" / "idle-4xa100.toml")
USER_PY = shutil.which("python3", path="/usr/bin:/bin") or sys.executable

USERS = ("alice", "bob", "carol")
JOBS = 1002  # 334 per user
KILLS = 20
GIB = 1 << 30
GPU_MEMORY = 80 * GIB  # idle-4xa100.toml: A100-SXM4-80GB
SHARED_MEM = 30 * GIB  # two fit on one GPU, three do not

#: The job: its own start and end, with the GPUs it was given, on its stdout (the
#: owner's log, opened in append mode: each `echo` is one atomic write).
JOB = (
    'echo "J $GPUWARDEN_JOB $1 start $(date +%s%N) $GPUWARDEN_GPUS"; sleep 0.02; '
    'echo "J $GPUWARDEN_JOB $1 end $(date +%s%N) $GPUWARDEN_GPUS"'
)

#: One client per user, as that user: submits its jobs one after another over one
#: connection, and reconnects when the service is killed. A submit whose answer was
#: lost may or may not have been recorded; the client then looks for its tag in its
#: own jobs before submitting again, so each tag is one job (the queue shows owners
#: their commands). Prints {tag: job id} at the end.
CLIENT = r"""
import json, os, sys, time
from gpuwarden.base.errors import UserError
from gpuwarden.queueclient.client import connect

sock, user, plan = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
script, log, work = plan["script"], plan["log"], plan["work"]

def client():
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            c = connect(sock, timeout=300)  # a slow answer is not a lost one
        except UserError:
            c = None
        if c is not None:
            return c
        time.sleep(0.01)
    raise SystemExit("the service did not come back within 60 s")

def find(c, tag):
    # Small listings: the job is active, or among the latest to end (a reply larger
    # than the socket's buffer is not what this test is about).
    # Two calls: a job that ends between them is in both listings, under one id. Two
    # different ids for one tag would be the job submitted twice.
    rows = c.call("queue")["jobs"] + c.call("jobs", limit=300)["jobs"]
    found = sorted({r["id"] for r in rows if r["command"] and r["command"][-1] == tag})
    if len(found) > 1:
        raise SystemExit(f"tag {tag} was recorded as {len(found)} jobs: {found}")
    return found[0] if found else None

def mine(c):
    return sum(1 for r in c.call("queue")["jobs"] if r["command"])

ids, retries = {}, 0
c = client()
for n, (tag, count, mem) in enumerate(plan["jobs"]):
    while n % 10 == 0:  # at most ~30 of ours waiting: the queue stays a screenful
        try:
            if mine(c) < 20:
                break
            time.sleep(0.05)
        except UserError:
            c.close()
            c = client()
    request = {"count": count}
    if mem:
        request["mem"] = mem
    fields = dict(argv=["sh", "-c", script, "job", tag], cwd=work, output=log,
                  env={"PATH": "/usr/bin:/bin"}, request=request)
    while tag not in ids:
        try:
            ids[tag] = c.call("submit", **fields)["job"]
        except UserError as err:
            if "connection" not in str(err) and "closed" not in str(err):
                raise SystemExit(f"submit {tag}: {err}")
            retries += 1
            c.close()
            while True:
                c = client()
                try:
                    job = find(c, tag)
                    break
                except UserError:
                    c.close()
            if job is not None:
                ids[tag] = job
print(json.dumps({"ids": ids, "retries": retries}))
"""


#: One attached client per user, as that user, its stdout appended to its own log:
#: `gpuwarden run`'s way (run_attached) of running ATTACHED jobs one after another
#: through the kills. Each must exit with its job's status (0); a client never hangs
#: (the test's deadline) and never gives up (its reconnect bound is the test's).
ATTACHED_CLIENT = r"""
import json, sys, time
from gpuwarden.base.errors import UserError
from gpuwarden.queueclient.client import run_attached
sock, plan = sys.argv[1], json.loads(sys.argv[2])
for tag in plan["tags"]:
    fields = dict(argv=["sh", "-c", plan["script"], "job", tag], cwd=plan["work"],
                  env={"PATH": "/usr/bin:/bin"}, request={"count": 1})
    deadline = time.monotonic() + 60
    while True:
        try:
            status = run_attached(fields, sock, None, quiet=True, reconnect=120)
            break
        except UserError as err:  # killed before the submit: nothing was recorded
            if "does not answer" not in str(err) or time.monotonic() > deadline:
                raise
            time.sleep(0.01)
    if status != 0:
        raise SystemExit(f"attached job {tag} exited {status}")
"""
ATTACHED = 10  # per user


class Service:
    """`gpuwarden serve` as a child that can be killed and started again."""

    def __init__(self, root: Path, work: Path, socket: str) -> None:
        self.root = root
        self.work = work
        self.socket = socket
        self.state = str(root / "service")
        self.leases = str(root / "service-leases")
        self.log = root / "serve.log"
        self.proc: Optional[subprocess.Popen[bytes]] = None
        self.starts = 0

    def start(self) -> None:
        env = dict(os.environ, PYTHONPATH=SRC, GPUWARDEN_SIM=SPEC, GPUWARDEN_LEASE_DIR=self.leases)
        with contextlib.suppress(OSError):
            os.unlink(self.socket)
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "gpuwarden",
                    "serve",
                    "--socket",
                    self.socket,
                    "--state-dir",
                    self.state,
                    "--log-level",
                    "INFO",
                ],
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        self.starts += 1

    def ready(self) -> None:
        """Wait until the service answers (it re-adopted its jobs by then)."""
        from gpuwarden.queueclient.probe import wait_until_running

        proc = self.proc
        assert proc is not None
        found = wait_until_running(self.socket, 60, alive=lambda: proc.poll() is None, poll=0.01)
        assert found["running"], f"the service did not start: {found['error']}\n" + self.tail()

    def kill(self, sig: int = signal.SIGKILL) -> None:
        assert self.proc is not None
        self.proc.send_signal(sig)
        self.proc.wait(60)

    def about(self, jobs: Iterable[int]) -> str:
        """The log's lines about `jobs`, and its restarts."""
        import re

        pattern = re.compile(r"serving on|\bjobs? ({})\b".format("|".join(str(j) for j in jobs)))
        lines = self.log.read_text(errors="replace").splitlines()
        return "\n".join(ln[:160] for ln in lines if pattern.search(ln))

    def tail(self) -> str:
        return self.log.read_text(errors="replace")[-4000:]

    def call(self, op: str, **fields: Any) -> dict[str, Any]:
        from gpuwarden.base.errors import UserError
        from gpuwarden.queueclient.client import require

        try:
            with require(self.socket) as client:
                return client.call(op, **fields)
        except UserError as err:
            assert self.proc is not None
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(2)  # did it just die?
                raise AssertionError(f"the service died: {err}\n{self.tail()}") from None
            raise


def job_plan(rng: random.Random, user: str, n: int) -> list[tuple[str, int, Optional[int]]]:
    """`n` jobs of `user`: mostly one whole GPU, some two, some sharing by memory."""
    jobs = []
    for i in range(n):
        roll = rng.random()
        count, mem = (1, SHARED_MEM) if roll < 0.3 else (2, None) if roll < 0.4 else (1, None)
        jobs.append((f"{user}-{i}", count, mem))
    return jobs


def check_intervals(lines: list[str], mem_of: dict[int, Optional[int]]) -> dict[int, int]:
    """Each job's start and end lines → how often each job started; assert that no GPU
    was ever shared except by `mem` jobs that fit together."""
    starts: dict[int, int] = defaultdict(int)
    begun: dict[int, tuple[int, str]] = {}
    events: dict[str, list[tuple[int, int, int]]] = defaultdict(list)  # gpu -> (t, +1/-1, job)
    for line in lines:
        _, job_s, _tag, what, stamp, gpus = line.split()
        job, t = int(job_s), int(stamp)
        if what == "start":
            starts[job] += 1
            begun[job] = (t, gpus)
        else:
            t0, g0 = begun.pop(job)
            assert g0 == gpus and t >= t0, line
            for gpu in gpus.split(","):
                events[gpu] += [(t0, 1, job), (t, -1, job)]
    assert not begun, f"jobs started and never ended: {sorted(begun)}"
    for gpu, evs in events.items():
        active: set[int] = set()
        for _t, kind, job in sorted(evs, key=lambda e: (e[0], e[1])):  # ends before starts
            if kind < 0:
                active.discard(job)
                continue
            active.add(job)
            if len(active) > 1:
                whole = [j for j in active if mem_of[j] is None]
                used = sum(mem_of[j] or 0 for j in active)
                assert not whole and used <= GPU_MEMORY, (
                    f"jobs {sorted(active)} shared GPU {gpu} (whole-GPU: {whole}, "
                    f"declared {used / GIB:.0f} GiB of {GPU_MEMORY / GIB:.0f})"
                )
    return dict(starts)


#: The journal's fsyncs cost ~10 ms each on the development disk and dominate the run;
#: a `kill -9` loses no page cache, so memory-backed files test the same recovery.
FAST_DIR = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None


@pytest.fixture
def open_dir() -> Iterator[Path]:
    d = Path(tempfile.mkdtemp(prefix="gw-stress-", dir=FAST_DIR))
    d.chmod(0o755)
    (d / "work").mkdir()
    (d / "work").chmod(0o1777)
    (d / "sock").mkdir()
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.mark.slow
def test_a_thousand_jobs_survive_twenty_kill_9s(open_dir: Path) -> None:
    people = {name: make_user(name, groups=("lab",) if name == "alice" else ()) for name in USERS}
    seed = int(os.environ.get("GPUWARDEN_STRESS_SEED") or random.SystemRandom().randrange(10**6))
    print(f"stress seed {seed} (replay: GPUWARDEN_STRESS_SEED={seed})")
    rng = random.Random(seed)
    work = open_dir / "work"
    service = Service(open_dir, work, str(open_dir / "sock" / "gpuwarden.sock"))
    plans = {u: job_plan(rng, u, JOBS // len(USERS)) for u in USERS}
    clients: dict[str, subprocess.Popen[str]] = {}
    runners: dict[str, subprocess.Popen[str]] = {}
    service.start()
    service.ready()
    try:
        for user, person in people.items():
            plan = {
                "script": JOB,
                "log": str(work / f"{user}.log"),
                "work": str(work),
                "jobs": plans[user],
            }
            clients[user] = subprocess.Popen(
                [USER_PY, "-c", CLIENT, service.socket, user, json.dumps(plan)],
                env={**hermetic(), "PYTHONPATH": SRC, "PATH": "/usr/bin:/bin"},
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                preexec_fn=become(person),
                cwd=str(work),
            )
            attached_plan = {
                "script": JOB,
                "work": str(work),
                "tags": [f"{user}-a{i}" for i in range(ATTACHED)],
            }
            with open(work / f"{user}-attached.log", "ab") as log:
                runners[user] = subprocess.Popen(
                    [USER_PY, "-c", ATTACHED_CLIENT, service.socket, json.dumps(attached_plan)],
                    env={**hermetic(), "PYTHONPATH": SRC, "PATH": "/usr/bin:/bin"},
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.PIPE,
                    text=True,
                    preexec_fn=become(person),
                    cwd=str(work),
                )
        # KILLS kills at random moments while the clients submit and jobs run: each
        # restart first serves (answers), then lives a random 0.05-2 s, so the service
        # spends most of the run serving rather than starting up.
        kills = 0
        while kills < KILLS:
            service.ready()
            time.sleep(rng.uniform(0.05, 2.0))  # a random moment, not a wait for a condition
            service.kill()
            kills += 1
            service.start()
        outputs = {u: c.communicate(timeout=600) for u, c in clients.items()}
        for user, (_out, err) in outputs.items():
            assert clients[user].returncode == 0, f"seed {seed}: client {user}: {err[-2000:]}"
        for user, runner in runners.items():
            _, err = runner.communicate(timeout=300)
            assert runner.returncode == 0, f"seed {seed}: attached {user}: {err[-2000:]}"
        ids: dict[str, int] = {}
        for out, _err in outputs.values():
            ids.update(json.loads(out)["ids"])
        # Every job ends on its own; poll with a generous deadline.
        service.ready()
        wait_for(
            lambda: not service.call("queue")["jobs"],
            300,
            lambda: f"seed {seed}: every job ended\n{service.tail()}",
            every=0.2,
        )
    finally:
        for c in (*clients.values(), *runners.values()):
            if c.poll() is None:
                c.kill()
        if service.proc and service.proc.poll() is None:
            service.kill(signal.SIGTERM)

    journal = st.Store(os.path.join(service.state, "jobs.db"))
    rows = {
        j.id: {"state": j.state, "exit_code": j.exit_code, "error": j.error, "gpus": j.gpus}
        for j in journal.jobs(st.ACTIVE + st.ENDED)
    }
    # Attached jobs whose submit answer a kill lost: submitted again by their client;
    # the copy never started and was cancelled.
    unanswered = {
        j.id
        for j in journal.jobs(st.ENDED)
        if j.attached and j.state == st.CANCELLED and j.started is None
    }
    journal.close()
    for i in unanswered:
        del rows[i]
    tags = {tag: (count, mem) for plan in plans.values() for tag, count, mem in plan}
    attached_lines = []
    for user in USERS:
        text = (work / f"{user}-attached.log").read_text()
        stray = [ln for ln in text.splitlines() if not ln.startswith("J ")]
        assert not stray, f"seed {seed}: {user}'s attached jobs wrote {stray[:5]}"
        attached_lines += text.splitlines()
        for i in range(ATTACHED):
            tags[f"{user}-a{i}"] = (1, None)
    for line in attached_lines:
        ids.setdefault(line.split()[2], int(line.split()[1]))
    assert sorted(ids) == sorted(tags), f"seed {seed}: a submission was lost"
    assert len(set(ids.values())) == len(ids), f"seed {seed}: two tags share a job id"
    assert sorted(rows) == sorted(ids.values()), f"seed {seed}: the journal has other jobs"
    bad = {i: (r["state"], r["exit_code"], r["error"]) for i, r in rows.items()}
    bad = {i: v for i, v in bad.items() if v != ("COMPLETED", 0, None)}
    assert not bad, f"seed {seed}: jobs that did not complete with 0: {bad}\n" + service.about(bad)
    lines = []
    for user in USERS:
        text = (work / f"{user}.log").read_text()
        stray = [ln for ln in text.splitlines() if not ln.startswith("J ")]
        assert not stray, f"seed {seed}: {user}'s jobs wrote {stray[:5]}"
        lines += text.splitlines()
    lines += attached_lines
    wrong = [ln for ln in lines if ids.get(ln.split()[2]) != int(ln.split()[1])]
    assert not wrong, f"seed {seed}: jobs ran under another id: {wrong[:5]}"
    mem_of = {ids[tag]: tags[tag][1] for tag in ids}
    starts = check_intervals(lines, mem_of)
    twice = {j: n for j, n in starts.items() if n != 1}
    assert not twice, f"seed {seed}: jobs that started more than once: {twice}"
    assert sorted(starts) == sorted(rows), f"seed {seed}: jobs that never ran"
    for tag, job in ids.items():
        assert len(rows[job]["gpus"]) == tags[tag][0], (tag, rows[job])
    assert kills >= KILLS and service.starts == kills + 1


def test_a_lease_left_half_taken_by_a_killed_service_does_not_stop_the_next(
    open_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Killed between taking a GPU's lock and publishing the lease, the service leaves
    the lease's temporary file, named after the job; the job is queued again, and the
    next service must be able to start it (found by the stress test: it crashed on
    the leftover at every start)."""
    alice = make_user("alice", groups=("lab",))
    monkeypatch.setenv("GPUWARDEN_SIM", SPEC)
    from gpuwarden.machine.inventory import read_snapshot

    service = Service(open_dir, open_dir / "work", str(open_dir / "sock" / "gpuwarden.sock"))
    os.makedirs(service.leases, mode=0o755)
    for gpu in read_snapshot().gpus:  # the first job of a new journal is job 1
        Path(service.leases, f".tmp-{gpu.uuid}.1").write_text("")  # as leases named it
    service.start()
    try:
        service.ready()
        log = str(service.work / "out.log")

        subprocess.run(
            [
                USER_PY,
                "-c",
                CLIENT,
                service.socket,
                "alice",
                json.dumps(
                    {
                        "script": JOB,
                        "log": log,
                        "work": str(service.work),
                        "jobs": [("alice-0", 1, None)],
                    }
                ),
            ],
            env={**hermetic(), "PYTHONPATH": SRC, "PATH": "/usr/bin:/bin"},
            preexec_fn=become(alice),
            check=True,
            capture_output=True,
            timeout=120,
        )

        def drained() -> bool:
            assert service.proc is not None and service.proc.poll() is None, service.tail()
            return not service.call("queue")["jobs"]

        wait_for(drained, 60, lambda: f"an empty queue\n{service.tail()}")
        (row,) = service.call("jobs")["jobs"]
        assert (row["id"], row["state"], row["exit_code"]) == (1, "COMPLETED", 0), row
    finally:
        if service.proc and service.proc.poll() is None:
            service.kill(signal.SIGTERM)


def test_a_job_whose_service_died_before_reading_its_report_still_records_its_exit(
    tmp_path: Path,
) -> None:
    """The supervisor reports the job's pid to the service over a pipe. A service killed
    after the go-ahead and before reading that report closed the pipe; the supervisor
    must still wait for the job and write its exit record (the stress test found jobs
    recorded LOST: the supervisor died of SIGPIPE, the job ran on unrecorded)."""
    from components import require
    from gpuwarden.service import exitrecord, spawn
    from gpuwarden.service.identity import person

    require(os.geteuid() == 0, "starting a job as its owner needs root")
    status = tmp_path / "status"
    status.mkdir()
    launch = spawn.JobStart(
        job="7",
        argv=("sh", "-c", "exit 3"),
        owner=person(0),
        cwd=str(tmp_path),
        env={"PATH": "/usr/bin:/bin"},
        status_dir=str(status),
    )
    service = os.fork()
    if service == 0:  # a service that dies right after giving the go-ahead
        try:
            read_all = spawn._read_all

            def die(
                fd: int, timeout: float, until: Optional[bytes] = None, me: int = os.getpid()
            ) -> bytes:
                if os.getpid() == me:
                    os._exit(0)
                return read_all(fd, timeout, until)

            spawn._read_all = die  # type: ignore[assignment]
            spawn.start(launch)
        finally:
            os._exit(1)
    _, status_code = os.waitpid(service, 0)
    assert os.WIFEXITED(status_code) and os.WEXITSTATUS(status_code) == 0

    def exit_record() -> Optional[exitrecord.Ended]:
        ended = exitrecord.read_exit_record(str(status), "7")
        if ended is None:
            marker = spawn.read_marker(str(status), "7") or {}
            supervisor = marker.get("supervisor")
            gone = marker.get("pid") and supervisor and not spawn.alive(supervisor, marker["since"])
            assert not gone, "the supervisor died without writing the job's exit record"
        return ended

    ended = wait_for(exit_record, 30, "the job's exit record")
    assert (ended.code, ended.signal, ended.error) == (3, None, None)


def test_a_long_answer_reaches_a_client_that_reads_it_slowly(open_dir: Path) -> None:
    """`queue` on a long queue is several hundred kilobytes; a client that reads it
    a little later (a busy machine) must still get all of it."""
    import socket as sockets

    from gpuwarden.queueclient import protocol

    require_root()
    service = Service(open_dir, open_dir / "work", str(open_dir / "sock" / "gpuwarden.sock"))
    service.start()
    try:
        service.ready()
        from gpuwarden.queueclient.client import require

        with require(service.socket) as client:
            for _ in range(300):
                client.call(
                    "submit", argv=["true", "x" * 2000], cwd="/", hold=True, output="/dev/null"
                )
        sock = sockets.socket(sockets.AF_UNIX, sockets.SOCK_STREAM)
        sock.connect(service.socket)
        sock.sendall(protocol.encode({"v": protocol.VERSION, "op": "queue"}))
        time.sleep(0.5)  # a slow reader, on purpose
        sock.settimeout(30)
        data = b""
        while not data.endswith(b"\n"):
            chunk = sock.recv(1 << 20)
            if not chunk:
                break
            data += chunk
        sock.close()
        assert data.endswith(b"\n"), f"the answer was cut after {len(data)} bytes"
        page = json.loads(data)  # a page of the queue: every row of it, and where the next starts
        assert page["total"] == 300 and page["next"] == len(page["jobs"]) > 50
    finally:
        service.kill(signal.SIGTERM)


def require_root() -> None:
    from components import require

    require(os.geteuid() == 0, "the service runs as root")


def test_a_job_gets_sigpipe_at_its_default_though_its_supervisor_ignores_it(
    tmp_path: Path,
) -> None:
    """Ignored signals stay ignored across exec: the job must not inherit the
    supervisor's SIG_IGN for SIGPIPE (`yes | head` would then never end)."""
    from gpuwarden.service import exitrecord, spawn
    from gpuwarden.service.identity import person

    require_root()
    out = tmp_path / "out"
    launch = spawn.JobStart(
        job="8",
        argv=("sh", "-c", "grep SigIgn /proc/$$/status"),
        owner=person(0),
        cwd=str(tmp_path),
        env={"PATH": "/usr/bin:/bin"},
        status_dir=str(tmp_path),
        output=str(out),
    )
    started = spawn.start(launch)
    spawn.wait_supervisor(started.supervisor)
    ended = exitrecord.read_exit_record(str(tmp_path), "8")
    assert ended is not None and ended.code == 0, ended
    ignored = int(out.read_text().split()[1], 16)
    assert not ignored & (1 << (signal.SIGPIPE - 1)), out.read_text()
