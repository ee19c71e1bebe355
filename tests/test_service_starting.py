"""A job setting itself up does not hold the service: its supervisor's report is an
event of the loop (service.starting).

A job whose output is a FIFO nobody reads yet blocks in its own `open`, as its owner,
before its `exec`: it stays STARTING as long as that lasts. Meanwhile the service
answers, starts and ends other jobs; a cancel that comes meanwhile is kept and sent
once the job runs; a supervisor that dies before it reports fails the job with the
reason. (A loop that waited for each report served nobody until its 30 s ran out.)
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from rawservice import Raw
from servicetools import Server, submit
from users import make_user
from waiting import wait_for


def job(work: Path, argv: list[str], output: str = "/dev/null") -> dict[str, Any]:
    return {
        "argv": argv,
        "cwd": str(work),
        "env": {"PATH": "/usr/bin:/bin"},
        "output": output,
        "request": {"count": 1},
    }


def states(service: Raw) -> dict[int, str]:
    """Every job's state: the queue's (waiting, starting, running) and the history's."""
    rows = [*service.call("queue")["jobs"], *service.call("jobs")["jobs"]]
    return {row["id"]: row["state"] for row in rows}


@pytest.fixture
def fifo(tmp_path: Path) -> Iterator[Path]:
    """A FIFO with no reader yet; opened for reading (which lets a writer's `open` go
    on) by `release`, and always at the end so nothing is left blocked on it."""
    path = tmp_path / "out.fifo"
    os.mkfifo(path)
    yield path
    release(path)


def release(path: Path) -> None:
    """Let a job blocked opening `path` for writing go on (a reader that reads nothing)."""
    with contextlib.suppress(OSError):
        os.close(os.open(path, os.O_RDONLY | os.O_NONBLOCK))


def starting_now(service: Raw, job_id: int) -> bool:
    return states(service).get(job_id) == "STARTING"


def test_the_service_serves_on_while_a_job_sets_itself_up(
    raw_service: Raw, tmp_path: Path, fifo: Path
) -> None:
    service = raw_service
    stuck = service.call("submit", **job(tmp_path, ["sleep", "60"], str(fifo)))["job"]
    wait_for(lambda: starting_now(service, stuck), 30, "the job to be starting")
    assert service.call("stats")["starting"]["in_flight"] == 1
    # Another job starts, runs and ends while the first still sets itself up.
    other = service.call("submit", **job(tmp_path, ["true"]))["job"]
    wait_for(lambda: states(service)[other] == "COMPLETED", 30, f"job {other} to end")
    assert states(service)[stuck] == "STARTING"
    row = service.call("queue", ids=[stuck])["jobs"][0]
    assert row["state"] == "STARTING" and row["gpus"], row
    # Cancelled while starting: kept, and its SIGTERM sent once it runs.
    service.call("cancel", jobs=[stuck])
    assert states(service)[stuck] == "STARTING"
    release(fifo)
    wait_for(lambda: states(service)[stuck] == "CANCELLED", 30, f"job {stuck} cancelled")
    stats = service.call("stats")["starting"]
    assert (stats["begun"], stats["in_flight"], stats["overdue"]) == (2, 0, 0), stats


def test_a_supervisor_that_dies_before_it_reports_fails_its_job(
    raw_service: Raw, tmp_path: Path, fifo: Path
) -> None:
    service = raw_service
    stuck = service.call("submit", **job(tmp_path, ["true"], str(fifo)))["job"]
    wait_for(lambda: starting_now(service, stuck), 30, "the job to be starting")
    # The service's forker forked it (the service never forks): the forker's child.
    forker = only_child(raw_service.pid, lambda pid: child_of(pid) != [])
    supervisor = only_child(forker, lambda pid: child_of(pid) != [])
    (setting_up,) = child_of(supervisor)
    os.kill(supervisor, signal.SIGKILL)
    try:
        wait_for(lambda: states(service)[stuck] == "FAILED", 30, f"job {stuck} to fail")
        row = next(r for r in service.call("jobs")["jobs"] if r["id"] == stuck)
        assert row["error"] == "its supervisor died", row
        # Its GPU is free again: the next job starts on it.
        other = service.call("submit", **job(tmp_path, ["true"]))["job"]
        wait_for(lambda: states(service)[other] == "COMPLETED", 30, f"job {other} to end")
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(setting_up, signal.SIGKILL)


def child_of(pid: int) -> list[int]:
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as fh:
            return [int(p) for p in fh.read().split()]
    except OSError:
        return []


def only_child(pid: int, wanted: Any) -> int:
    """The one child of `pid` that `wanted` picks (the supervisor: it has a child)."""
    found = wait_for(
        lambda: [c for c in child_of(pid) if wanted(c)] or None, 30, "the job's supervisor"
    )
    assert len(found) == 1, found
    return int(found[0])


class _Held:
    """A lease as far as a start in flight uses it."""

    def __init__(self) -> None:
        self.released = False

    def release(self) -> None:
        self.released = True


def test_a_report_that_does_not_come_in_time_fails_its_job(tmp_path: Path) -> None:
    """The loop's tick fails a start whose supervisor has not reported within
    `spawn.REPORT_WITHIN`, with the error a start that waited for it gave, lets go of
    its lease and of its pipe and kills its supervisor; one still within its time is left
    in flight."""
    import selectors
    import time
    from types import SimpleNamespace

    from gpuwarden.service import spawn, starting
    from gpuwarden.service import store as s

    journal = s.Store(str(tmp_path / "jobs.db"))
    late, waiting = (
        journal.add(
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
        for _ in range(2)
    )
    life: Any = SimpleNamespace(
        starts=starting.Starts(),
        selector=selectors.DefaultSelector(),
        store=journal,
        notifier=None,  # the jobs ask for no notice
    )
    now = time.monotonic()
    pipes, leases, supervisors = [], [], []
    for record, deadline in ((late, now - 1), (waiting, now + spawn.REPORT_WITHIN)):
        journal.update(record.id, state=s.STARTING, gpus=("GPU-1",), started=time.time())
        read_end, write_end = os.pipe()
        pipes.append(write_end)
        leases.append(_Held())
        supervisors.append(subprocess.Popen(["sleep", "60"]))  # a supervisor that hangs
        forked = spawn.Forked(supervisor=supervisors[-1].pid, report=read_end)
        start = starting.Starting(record.id, forked, leases[-1], (), deadline)  # type: ignore[arg-type]
        starting.begun(life, start)
    assert life.starts.stats()["most_in_flight"] == 2
    starting.overdue(life, now)
    failed = journal.get(late.id)
    assert failed is not None and failed.state == s.FAILED
    assert failed.error == "a job's supervisor did not answer in time"
    assert leases[0].released and not leases[1].released
    # The late one's supervisor is killed and reaped (so its leases go), the other runs.
    assert spawn.start_time(supervisors[0].pid) == -1
    assert supervisors[1].poll() is None
    supervisors[1].kill()
    supervisors[1].wait()
    assert list(life.starts.flight) == [waiting.id]
    assert life.starts.stats()["overdue"] == 1
    assert len(life.selector.get_map()) == 1
    for fd in pipes:
        os.close(fd)


def test_a_job_starting_across_a_restart_is_adopted_and_runs_as_any_other(
    server: Server,
) -> None:
    """The service stops while a job still sets itself up (its report not read): the
    supervisor runs the job on and writes its pid to its marker. The restarted service
    adopts it STARTING, makes it RUNNING once the marker names its pid, and a cancel
    then ends it as it ends any running job."""
    alice = make_user("alice", ("lab",))
    out = server.work / "adopted.fifo"
    os.mkfifo(out)
    os.chmod(out, 0o666)
    try:
        job_id = submit(server, alice, ["sleep", "60"], output=str(out))
        server.wait_state(job_id, ("STARTING",))
        server.kill(signal.SIGTERM)  # a stop: the job and its supervisor run on
        server.start()
        assert server.job(job_id)["state"] == "STARTING"
        release(out)
        server.wait_state(job_id, ("RUNNING",))
        assert server.call(alice, "cancel", jobs=[job_id])["jobs"] == [job_id]
        server.wait_state(job_id, ("CANCELLED",))
    finally:
        release(out)


class _Journal:
    """A journal as far as the go-ahead uses it: `sync` checks that no supervisor has
    had its go-ahead yet, then fails (`fails`) or makes the records durable."""

    def __init__(self, go_reads: list[int], fails: bool) -> None:
        self.go_reads, self.fails, self.synced = go_reads, fails, 0

    def sync(self) -> None:
        for fd in self.go_reads:  # nothing written yet: the supervisors still wait
            os.set_blocking(fd, False)
            with pytest.raises(BlockingIOError):
                os.read(fd, 1)
        if self.fails:
            raise OSError(5, "Input/output error")
        self.synced += 1


@pytest.mark.parametrize("fails", [False, True])
def test_the_starts_of_a_pass_get_their_go_ahead_after_one_sync(fails: bool) -> None:
    """The starts of one pass are recorded STARTING without an fsync each; `go` makes
    them durable with one sync, and only then does each supervisor read its go-ahead.
    A sync that fails gives none: each supervisor reads end-of-file (it exits without
    running its job), its report is still awaited as an event (it fails the job), and
    the error goes on to the loop."""
    import selectors
    import time
    from types import SimpleNamespace

    from gpuwarden.service import spawn, starting
    from gpuwarden.service.placing import go

    go_reads, starts, fds = [], [], []
    for job_id in (1, 2):
        go_r, go_w = os.pipe()
        report_r, report_w = os.pipe()
        go_reads.append(go_r)
        fds += [go_r, report_w]
        forked = spawn.Forked(supervisor=0, report=report_r, go=go_w)
        starts.append(starting.Starting(job_id, forked, _Held(), (), time.monotonic() + 30))  # type: ignore[arg-type]
    journal = _Journal(go_reads, fails)
    life: Any = SimpleNamespace(
        starts=starting.Starts(), selector=selectors.DefaultSelector(), store=journal
    )
    try:
        if fails:
            with pytest.raises(OSError):
                go(life, starts)
        else:
            go(life, starts)
        for fd in go_reads:
            os.set_blocking(fd, True)
            assert os.read(fd, 1) == (b"" if fails else b"g")
            assert os.read(fd, 1) == b""  # its write end closed
        assert journal.synced == (0 if fails else 1)
        assert all(s.forked.go == -1 for s in starts)
        assert sorted(life.starts.flight) == [1, 2]  # their reports are events of the loop
    finally:
        for start in starts:
            with contextlib.suppress(OSError):
                os.close(start.forked.report)
        for fd in fds:
            os.close(fd)
