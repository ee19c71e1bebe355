"""The service's forker: the supervisors are forked by a small process of its own.

service.forker forks each supervisor on a request over a socket pair (the launch as
JSON, its descriptors by SCM_RIGHTS) and answers with its pid, start time and a pidfd.
These tests hold what the service relies on: the supervisor is the forker's child
and holds nothing of the forker's; the go-ahead pipe's write end stays with the
caller (no go-ahead: nothing runs, even when the forker has gone); supervisors
outlive the forker, which ends at its socket's end-of-file; a forker found dead is
started again, and one that dies with a request fails that start, which never runs.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import launches
from gpuwarden.base.errors import UserError
from gpuwarden.service import exitrecord, jobprocess, litter, spawn, staging
from gpuwarden.service.forker import SPARES, Forker
from rawservice import Raw
from waiting import wait_for


def launch(status_dir: Path, argv: list[str], job: str = "7") -> spawn.JobStart:
    return launches.launch(status_dir, argv, job, extra_env={"GPUWARDEN_JOB_NOTE": "naïve ✓"})


@pytest.fixture
def status_dir(tmp_path: Path) -> Path:
    d = tmp_path / "status"
    d.mkdir(mode=0o700)
    return d


@pytest.fixture
def forker() -> Iterator[Forker]:
    made = Forker()
    yield made
    made.close()


def parent_of(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as fh:
        return int(fh.read().rsplit(")", 1)[1].split()[1])


def sockets_of(pid: int) -> list[str]:
    names = []
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            names.append(os.readlink(f"/proc/{pid}/fd/{fd}"))
        except OSError:
            continue
    return [n for n in names if n.startswith("socket:")]


def report(forked: spawn.Forked, job: str = "7") -> spawn.Started:
    message = spawn._read_all(forked.report, 30, until=b"\n")
    os.close(forked.report)
    return spawn.report_of(job, forked.supervisor, message, pidfd=forked.pidfd)


def test_the_forker_forks_the_supervisor_and_gives_a_pidfd_of_it(
    status_dir: Path, forker: Forker, tmp_path: Path
) -> None:
    """The supervisor is the forker's child, not ours; it holds one socket, its own (the
    forker's is closed with all it does not need); its job runs with what the launch
    said; the pidfd names it to its end, once the service lets go of it, and the
    forker reaps it."""
    out = tmp_path / "out"
    job = launch(status_dir, ["sh", "-c", f'echo "$GPUWARDEN_JOB_NOTE" > {out}'])
    seen: dict[str, int] = {}
    forked = spawn.begin(
        job,
        on_forked=lambda pid, since: seen.update(pid=pid, since=since),
        go=False,
        forker=forker.fork,
    )
    try:
        assert forked.pidfd >= 0 and seen["pid"] == forked.supervisor
        assert forker.proc is not None and parent_of(forked.supervisor) == forker.proc.pid
        assert seen["since"] == spawn.start_time(forked.supervisor) > 0
        wait_for(lambda: len(sockets_of(forked.supervisor)) == 1, 30, "the forker's socket closed")
        spawn.go_ahead(forked)
        started = report(forked)
        forker.close()  # the service lets go of the supervisors
        assert jobprocess.exited(forked.pidfd, 30), "the supervisor ends once let go"
    finally:
        os.close(forked.pidfd)
    assert started.pid > 0 and exitrecord.read_exit_record(str(status_dir), "7") is not None
    assert out.read_text() == "naïve ✓\n"
    wait_for(lambda: not os.path.exists(f"/proc/{forked.supervisor}"), 30, "reaped by the forker")
    assert forker.stats()["forks"] == 1


def run_to_end(forker: Forker, job: spawn.JobStart, ended: bool = True) -> spawn.Forked:
    """Start `job`, read its supervisor's report to its end-of-file (the job's end),
    and, as the service does once it has read it, say it is done with the supervisor."""
    forked = spawn.begin(job, forker=forker.fork)
    try:
        message = spawn._read_all(forked.report, 30)
        spawn.report_of(job.job, forked.supervisor, message, pidfd=forked.pidfd)
    finally:
        os.close(forked.report)
    if ended:
        forker.ended(forked.supervisor)
    return forked


def test_a_supervisor_whose_job_ended_runs_the_next_one(
    status_dir: Path, forker: Forker, tmp_path: Path
) -> None:
    """Once the service is done with a job's supervisor, it takes the next launch
    before any spare never used: the same process, holding nothing of its last job
    (its lease let go at that job's end, the next one's held to its end). No fork, no
    exit, and its pages are its own already."""
    import fcntl

    lease = tmp_path / "lease"
    lease.touch()

    def locked() -> bool:
        probe = os.open(lease, os.O_RDONLY)
        try:
            fcntl.flock(probe, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        finally:
            os.close(probe)
        return False

    supervisors = []
    for n in (1, 2):
        fd = os.open(lease, os.O_RDONLY)
        fcntl.flock(fd, fcntl.LOCK_EX)
        job = launches.launch(status_dir, ["true"], job=str(n), keep=(fd,))
        forked = spawn.begin(job, forker=forker.fork)
        os.close(fd)  # the supervisor's copy holds the lock now
        try:
            message = spawn._read_all(forked.report, 30)
            assert spawn.report_of(str(n), forked.supervisor, message, pidfd=forked.pidfd).pid
            assert not locked(), "the lease let go at the job's end"
            forker.ended(forked.supervisor)
            supervisors.append(forked.supervisor)
        finally:
            os.close(forked.report)
            os.close(forked.pidfd)
        assert exitrecord.read_exit_record(str(status_dir), str(n)).ok  # type: ignore[union-attr]
    assert supervisors[0] == supervisors[1], "the same supervisor ran both"
    assert forker.stats()["recycled"] == 1 and forker.stats()["forks"] == 2


def test_a_supervisor_is_taken_again_only_once_the_service_is_done_with_its_job(
    status_dir: Path, forker: Forker, tmp_path: Path
) -> None:
    """Until the service has read a job's end and let go of its supervisor (`ended`),
    the supervisor is that job's, to signal and to wait for: the next start goes to a
    spare never used, however long ago the supervisor said it could take another."""
    first = run_to_end(forker, launch(status_dir, ["true"], job="1"), ended=False)
    time.sleep(0.3)  # its record is on disk, it has said so
    second = run_to_end(forker, launch(status_dir, ["true"], job="2"))
    assert second.supervisor != first.supervisor
    forker.ended(first.supervisor)
    third = run_to_end(forker, launch(status_dir, ["true"], job="3"))
    assert third.supervisor in (first.supervisor, second.supervisor)
    assert forker.stats()["recycled"] == 1
    for forked in (first, second, third):
        os.close(forked.pidfd)


def test_a_failed_start_or_an_attached_job_ends_its_supervisor(
    status_dir: Path, forker: Forker, tmp_path: Path
) -> None:
    """A supervisor takes no other job after one that could not start (the service
    learns of the failure by its exit) or one attached to a client's terminal (its
    session keeps that terminal)."""
    with pytest.raises(UserError, match="could not start"):
        run_to_end(forker, launch(status_dir, ["/nonexistent/program"], job="1"))
    null = os.open(os.devnull, os.O_RDWR)
    try:
        attached = run_to_end(
            forker, launches.launch(status_dir, ["true"], job="2", stdio=(null, null, null))
        )
    finally:
        os.close(null)
    try:
        assert jobprocess.exited(attached.pidfd, 30), "an attached job's supervisor ends"
    finally:
        os.close(attached.pidfd)
    forker._recycle()  # what they said: their sockets closed
    assert forker.stats()["recycled"] == 0 and not forker.busy


def test_no_go_ahead_runs_nothing_and_supervisors_outlive_the_forker(
    status_dir: Path, forker: Forker, tmp_path: Path
) -> None:
    """The forker ends when its socket closes (the service has gone); the supervisors
    it forked do not: one given its go-ahead after runs its job, one whose go-ahead
    pipe is closed runs nothing."""
    ran = tmp_path / "ran"
    kept = spawn.begin(
        launch(status_dir, ["touch", str(ran)], job="1"), go=False, forker=forker.fork
    )
    dropped = spawn.begin(
        launch(status_dir, ["touch", str(tmp_path / "never")], job="2"),
        go=False,
        forker=forker.fork,
    )
    proc = forker.proc
    assert proc is not None
    forker.close()
    assert proc.returncode == 0, "the forker ended at its end-of-file"
    for forked in (kept, dropped):
        assert not jobprocess.exited(forked.pidfd, 0), "a supervisor outlives the forker"
    spawn.go_ahead(dropped, run=False)
    spawn.go_ahead(kept)
    with pytest.raises(UserError, match="supervisor died"):
        report(dropped, "2")
    assert report(kept, "1").pid > 0
    for forked in (kept, dropped):
        assert jobprocess.exited(forked.pidfd, 30)
        os.close(forked.pidfd)
    wait_for(ran.exists, 30, "the job given its go-ahead")
    assert not (tmp_path / "never").exists()


def test_a_forker_found_dead_is_started_again(status_dir: Path, forker: Forker) -> None:
    forker.warm()
    assert forker.proc is not None
    first = forker.proc.pid
    os.kill(first, signal.SIGKILL)
    forker.proc.wait()
    forked = spawn.begin(launch(status_dir, ["true"]), forker=forker.fork)
    try:
        assert report(forked).pid > 0
    finally:
        os.close(forked.pidfd)
    assert forker.stats()["started"] == 2 and forker.stats()["pid"] != first


def test_a_forker_that_dies_with_a_request_is_replaced(
    status_dir: Path, forker: Forker, tmp_path: Path
) -> None:
    """A request to the forker is for a spare supervisor, which has nothing to run: the
    forker dying with one is started again and the start goes on; the spare it may
    have forked exits at its socket's end-of-file."""
    forker.warm()  # it has the request for a spare while it starts up
    assert forker.proc is not None
    stuck = forker.proc
    os.kill(stuck.pid, signal.SIGSTOP)  # it will never answer
    killer = threading.Timer(0.5, lambda: os.kill(stuck.pid, signal.SIGKILL))
    killer.start()
    try:
        forked = spawn.begin(launch(status_dir, ["true"], job="8"), forker=forker.fork)
    finally:
        killer.join()
    try:
        assert report(forked, "8").pid > 0
    finally:
        os.close(forked.pidfd)
    assert forker.stats()["started"] == 2


def test_a_spare_that_died_before_its_launch_is_replaced(
    status_dir: Path, forker: Forker, tmp_path: Path
) -> None:
    """A spare killed while it waits is found dead as the launch is sent to it (nothing
    of the launch reached it): the next one runs the job."""
    first = spawn.begin(launch(status_dir, ["true"], job="1"), forker=forker.fork)
    report(first, "1")
    os.close(first.pidfd)
    spare = forker._take()  # the next spare
    forker.spares.insert(0, spare)  # put back, as the next start finds it
    os.kill(spare.pid, signal.SIGKILL)
    assert jobprocess.exited(spare.pidfd, 30)
    ran = tmp_path / "ran"
    forked = spawn.begin(launch(status_dir, ["touch", str(ran)], job="2"), forker=forker.fork)
    try:
        assert forked.supervisor != spare.pid
        assert report(forked, "2").pid > 0
    finally:
        os.close(forked.pidfd)
    wait_for(ran.exists, 30, "the job, run by the next spare")
    assert forker.stats()["forks"] == 2


def test_an_overdue_start_kills_its_supervisor_through_its_pidfd(
    status_dir: Path, forker: Forker, tmp_path: Path
) -> None:
    """A supervisor the forker forked is not the service's child: a start given up
    (service.starting `overdue`) kills it by its pidfd, waits for its end there, and
    the forker reaps it."""
    import selectors
    import time
    from types import SimpleNamespace

    from gpuwarden.service import starting
    from gpuwarden.service import store as s

    journal = s.Store(str(tmp_path / "jobs.db"))
    record = journal.add(
        s.new_job(
            uid=0,
            gid=0,
            user="root",
            argv=("true",),
            cwd="/",
            env={},
            umask=0o022,
            request={"count": 1},
        )
    )
    journal.update(record.id, state=s.STARTING, gpus=("GPU-1",), started=time.time())
    life: Any = SimpleNamespace(
        starts=starting.Starts(), selector=selectors.DefaultSelector(), store=journal, notifier=None
    )
    ran = tmp_path / "ran"
    forked = spawn.begin(launch(status_dir, ["touch", str(ran)]), go=False, forker=forker.fork)
    held = SimpleNamespace(released=False)
    held.release = lambda: setattr(held, "released", True)
    starting.begun(life, starting.Starting(record.id, forked, held, (), time.monotonic() - 1))  # type: ignore[arg-type]
    starting.overdue(life, time.monotonic())
    assert forked.pidfd == -1, "closed once it has ended"
    ended = journal.get(record.id)
    assert ended is not None and ended.state == s.FAILED and held.released
    wait_for(lambda: not os.path.exists(f"/proc/{forked.supervisor}"), 30, "reaped by the forker")
    # Too late: nobody is left to run it (a job process forked as its supervisor was
    # killed may hold the pipe a moment, and ends without its supervisor's byte).
    with contextlib.suppress(BrokenPipeError):
        spawn.go_ahead(forked)
    time.sleep(0.5)
    assert not ran.exists()


def test_the_forker_ends_with_the_service_and_the_jobs_run_on(
    raw_service: Raw, tmp_path: Path
) -> None:
    """Under the simulated machine the forker has the service's environment; killed
    at once (SIGKILL), the service takes its forker and the spare supervisors with it
    (their sockets' end-of-file), never the job its forker started, whose supervisor
    stays for the next service."""
    service = raw_service
    forker = service.call("stats")["forker"]
    assert forker["pid"] > 0 and parent_of(forker["pid"]) == service.pid
    with open(f"/proc/{forker['pid']}/environ", "rb") as fh:
        environ = dict(v.split(b"=", 1) for v in fh.read().split(b"\0") if b"=" in v)
    assert environ.get(b"GPUWARDEN_SIM", b"").endswith(b".toml"), environ.keys()
    # A job that ends first: its supervisor waits for another one, as the spares do.
    service.call(
        "submit",
        argv=["true"],
        cwd=str(tmp_path),
        env={"PATH": "/usr/bin:/bin"},
        output="/dev/null",
        request={"count": 1},
    )
    wait_for(
        lambda: [j["state"] for j in service.call("jobs")["jobs"]] == ["COMPLETED"],
        30,
        "the first job to end",
    )
    service.call(
        "submit",
        argv=["sleep", "60"],
        cwd=str(tmp_path),
        env={"PATH": "/usr/bin:/bin"},
        output="/dev/null",
        request={"count": 1},
    )

    def running() -> list[int]:  # the forker's child, the supervisor; its child, the job
        return [
            job
            for supervisor in children_of(forker["pid"])
            for job in children_of(supervisor)
            if command_of(job).startswith(b"sleep\0")
        ]

    (job,) = wait_for(running, 30, "the job to run")
    # The supervisors forked ahead, waiting for a job: the forker's children with none.
    spares = wait_for(
        lambda: [p for p in children_of(forker["pid"]) if not children_of(p)] or None,
        30,
        "the spare supervisors",
    )
    try:
        os.kill(service.pid, signal.SIGKILL)
        wait_for(lambda: gone_or_zombie(forker["pid"]), 30, "the forker to end with the service")
        wait_for(lambda: all(map(gone_or_zombie, spares)), 30, "the spares to end, unused")
        time.sleep(0.2)
        assert not gone_or_zombie(job), "the job runs on"
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(job, signal.SIGKILL)  # its supervisor writes its record, ends


def gone_or_zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except OSError:
        return True


def children_of(pid: int) -> list[int]:
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as fh:
            return [int(p) for p in fh.read().split()]
    except OSError:
        return []


def command_of(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def test_spares_stage_their_jobs_files_and_remove_them_without_a_launch(status_dir: Path) -> None:
    """A spare forked for a status directory makes its job's exit record room and
    marker data there while it waits (service.staging), under names no job's files
    have; its launch takes them (the room renamed, the marker named at the go-ahead);
    a supervisor whose job ended makes them again for its next; and spares let go of
    without a launch remove theirs."""

    def staged() -> list[str]:
        return sorted(p.name for p in status_dir.iterdir() if p.name.startswith("."))

    forker = Forker(str(status_dir))
    try:
        forker.warm()
        wait_for(lambda: len(staged()) == 2 * SPARES, 30, "the spares' staged files")
        assert all(re.fullmatch(r"\.supervisor-\d+-\d+\.(room|marker)", n) for n in staged())
        recorded: list[int] = []
        forked = spawn.begin(
            launch(status_dir, ["true"]),
            on_forked=lambda pid, since: recorded.extend((pid, since)),
            forker=forker.fork,
        )
        started = report(forked)
        os.close(forked.pidfd)
        ended = wait_for(lambda: exitrecord.read_exit_record(str(status_dir), "7"), 30, "its end")
        assert ended.ok
        supervisor, since = recorded
        assert spawn.read_marker(str(status_dir), "7") == {
            "supervisor": supervisor,
            "since": since,
            "pid": started.pid,
        }
        # Taken, all of it, and made again for its next job.
        wait_for(
            lambda: len([n for n in staged() if f"-{supervisor}-" in n]) == 2, 30, "made again"
        )
    finally:
        forker.close()
    wait_for(lambda: staged() == [], 30, "the unused spares' files removed")


def test_a_restart_takes_staged_files_for_no_jobs_and_removes_only_dead_ones(
    status_dir: Path,
) -> None:
    """Staged files are never a job's marker or ended job's files; a restart removes
    those whose supervisor died (by the pid and start time in their names) and keeps
    a live one's."""
    live = staging.stage(str(status_dir), os.getpid(), spawn.start_time())
    dead = staging.stage(str(status_dir), os.getpid(), spawn.start_time() + 1)  # a reused pid
    assert litter.left_by_ended(str(status_dir), []) == []
    assert sorted(staging.left_by_dead(str(status_dir), spawn.alive)) == sorted(
        [dead.room, dead.marker]
    )
    assert os.path.exists(live.room) and os.path.exists(live.marker)


def test_the_forker_loads_what_a_supervisor_runs_and_no_more() -> None:
    """The forker's modules are copied, page table and all, into every supervisor and
    every job at their forks: none of the service's own (its journal, loop, logging,
    threads, subprocesses, the configuration's parsing), and few of the rest."""
    import subprocess
    import sys

    src = str(Path(__file__).resolve().parent.parent / "src")

    def modules(then: str) -> set[str]:
        code = f"import sys; sys.path.insert(0, {src!r}); {then}print(' '.join(sys.modules))"
        ran = subprocess.run([sys.executable, "-I", "-c", code], capture_output=True, text=True)
        assert ran.returncode == 0, ran.stderr
        return set(ran.stdout.split())

    bare = modules("")  # the interpreter's own, and what its site's .pth files load
    out = modules("from gpuwarden.service.forkerprocess import load; load(); ") - bare
    service_only = {"sqlite3", "logging", "threading", "subprocess", "argparse", "email"}
    service_only |= {"platform", "gpuwarden.service.server", "gpuwarden.service.store"}
    assert not service_only & out, service_only & out
    assert not [m for m in out if m.startswith(("gpuwarden.queueclient", "gpuwarden.machine"))]
    assert len(out) <= 110, len(out)  # 88 with Python 3.11
