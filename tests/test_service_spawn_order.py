"""The supervisor's steps on the way from the go-ahead to the job, and from the job's
end to its exit record, in the order that keeps them off the service's path.

What must precede the job's exec stays before it (the marker's name;
tests/test_service_restart.py and test_service_fulldisk.py hold what each one
guarantees): these tests hold what may not be put back behind the go-ahead. The
job's fork and its own steps, the exit record's room and the marker's data are
made while the service commits the start, so that after the go-ahead only the
marker's name (a rename, no disk wait) is left before the exec; the job's pid is
written for a restart after the service has its report, not before; and a job that
leaves no process behind ends without a reading of every process on the machine.
"""

from __future__ import annotations

import os
import shutil
import sys
import time
from collections.abc import Mapping
from pathlib import Path

import pytest

from gpuwarden.base.errors import UserError
from gpuwarden.service import exitrecord, spawn, tree
from launches import launch
from waiting import wait_for

PY = shutil.which("python3", path="/usr/bin:/bin") or sys.executable


@pytest.fixture
def status_dir(tmp_path: Path) -> Path:
    d = tmp_path / "status"
    d.mkdir(mode=0o700)
    return d


def ended(status_dir: Path, job: str = "7") -> exitrecord.Ended:
    return wait_for(
        lambda: exitrecord.read_exit_record(str(status_dir), job), 30, f"job {job}'s exit record"
    )


def test_the_exit_records_room_is_made_before_the_go_ahead(status_dir: Path) -> None:
    """The room's disk write overlaps the service's commit of the start: it is there
    before the go-ahead, and the marker (the job may have run) is not."""
    room = Path(exitrecord.reserve_path(str(status_dir), "7"))
    seen: dict[str, bool] = {}

    def recorded(supervisor: int, since: int) -> None:  # the service's durable commit
        wait_for(room.exists, 30, "the room before the go-ahead")
        seen["marker"] = spawn.read_marker(str(status_dir), "7") is not None

    spawn.start(launch(status_dir, ["true"]), on_forked=recorded)
    assert seen == {"marker": False}
    assert ended(status_dir).ok


def test_a_supervisor_without_its_go_ahead_leaves_no_room(status_dir: Path) -> None:
    def refused(supervisor: int, since: int) -> None:
        wait_for(lambda: os.path.exists(exitrecord.reserve_path(str(status_dir), "7")), 30, "room")
        raise RuntimeError("the journal refused the start")

    with pytest.raises(RuntimeError):
        spawn.start(launch(status_dir, ["true"]), on_forked=refused)
    wait_for(lambda: not os.listdir(status_dir), 30, "the room removed, nothing run")


def test_the_marker_is_named_before_the_job_execs_and_after_its_fork(
    status_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The marker is named while the job is forked and set up already (the job exists
    while it is named), and the job's command runs only after it is."""
    log = tmp_path / "order"
    sync = spawn.name_marker

    def slow(where: str, job: str, staged: str) -> None:  # in the supervisor
        children = Path(f"/proc/self/task/{os.getpid()}/children").read_text().split()
        with open(log, "a") as fh:
            fh.write(f"syncing with {len(children)} child\n")
        time.sleep(0.3)  # a slow disk: a job that did not wait would run meanwhile
        sync(where, job, staged)
        with open(log, "a") as fh:
            fh.write("synced\n")

    monkeypatch.setattr(spawn, "name_marker", slow)
    spawn.start(launch(status_dir, ["sh", "-c", f"echo ran >> {log}"]))
    assert ended(status_dir).ok
    assert log.read_text().splitlines() == ["syncing with 1 child", "synced", "ran"]


def test_a_marker_that_cannot_be_named_runs_nothing(
    status_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ran = tmp_path / "ran"

    def failing(where: str, job: str, staged: str) -> None:
        raise UserError("cannot write job marker: Input/output error")

    monkeypatch.setattr(spawn, "name_marker", failing)
    with pytest.raises(UserError, match="could not be written to disk; not run"):
        spawn.start(launch(status_dir, ["touch", str(ran)]))
    assert not ran.exists()
    assert "could not be written" in (ended(status_dir).error or "")


def test_the_service_has_its_report_before_the_pid_is_written(
    status_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The marker's second write (the job's pid, for a restart) follows the report:
    here it waits until the test lets it, and `start` has returned meanwhile."""
    release = tmp_path / "release"
    write = spawn.write_marker

    def held_back(where: str, job: str, data: Mapping[str, object], durable: bool = True) -> None:
        if "pid" in data:  # in the supervisor: the second write
            wait_for(release.exists, 60, "the test to let the pid be written")
        write(where, job, data, durable)

    monkeypatch.setattr(spawn, "write_marker", held_back)
    started = spawn.start(launch(status_dir, ["true"]))
    assert "pid" not in (spawn.read_marker(str(status_dir), "7") or {})
    release.touch()
    assert ended(status_dir).ok
    assert started.pid > 0


def test_a_job_that_leaves_nothing_ends_without_reading_every_process(
    status_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The supervisor (a subreaper) with no child left has nothing below it: no pass
    over /proc. A job that leaves a process behind still has it found and killed."""
    log = tmp_path / "scans"
    scan = tree.descendants

    def counted(root: int) -> list[int]:
        with open(log, "a") as fh:
            fh.write(f"{root}\n")
        return scan(root)

    monkeypatch.setattr(tree, "descendants", counted)
    spawn.start(launch(status_dir, ["true"]))
    assert ended(status_dir).ok
    assert not log.exists()

    pidfile = tmp_path / "left"
    script = (
        "import os, time\n"
        "if os.fork() == 0:\n"
        f"    os.setsid(); open({str(pidfile) + '.tmp'!r}, 'w').write(str(os.getpid()))\n"
        f"    os.rename({str(pidfile) + '.tmp'!r}, {str(pidfile)!r}); time.sleep(600)\n"
        f"while not os.path.exists({str(pidfile)!r}): time.sleep(0.01)\n"
    )
    spawn.start(launch(status_dir, [PY, "-c", script], job="8"))
    assert ended(status_dir, "8").ok
    assert log.exists()
    left = int(pidfile.read_text())
    assert spawn.start_time(left) < 0 or Path(f"/proc/{left}/stat").read_text().split()[2] == "Z"


def test_a_job_that_fails_before_its_marker_is_named_says_why(
    status_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The job's own failure (here: a directory it cannot enter) comes while its
    supervisor still names the marker: the go-ahead then finds nobody to read it, and
    the failure is what the service is told, not a dead supervisor."""
    sync = spawn.name_marker

    def slow(where: str, job: str, staged: str) -> None:
        time.sleep(0.3)  # the job fails meanwhile
        sync(where, job, staged)

    monkeypatch.setattr(spawn, "name_marker", slow)
    missing = launch(status_dir, ["true"])
    missing = spawn.JobStart(**{**missing.__dict__, "cwd": str(status_dir / "gone")})
    with pytest.raises(UserError, match="cannot enter"):
        spawn.start(missing)


def test_the_job_waits_for_no_fsync_after_its_go_ahead(
    status_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Counted, not timed: between the go-ahead and the job's exec the supervisor does
    not wait for the disk (the marker's name survives a crash of the service, and a
    crash of the machine makes a restart take a job of that boot without its marker
    for one that may have run: service.boots); before the go-ahead neither (the room's
    blocks are taken by its write, service.exitrecord; the marker's data matters only
    to a live supervisor); the exit record's fsync comes after."""
    log = tmp_path / "events"
    fsync = os.fsync

    def counted(fd: int) -> None:
        fsync(fd)
        with open(log, "a") as fh:
            fh.write(os.path.basename(os.readlink(f"/proc/self/fd/{fd}")) + "\n")

    def go_ahead(supervisor: int, since: int) -> None:
        children = Path(f"/proc/{supervisor}/task/{supervisor}/children")
        wait_for(lambda: children.read_text().split(), 30, "the job's process")
        with open(log, "a") as fh:
            fh.write("go\n")

    monkeypatch.setattr(os, "fsync", counted)
    spawn.start(launch(status_dir, ["sh", "-c", f"echo ran >> {log}"]), on_forked=go_ahead)
    assert ended(status_dir).ok
    events = log.read_text().split()
    go, ran = events.index("go"), events.index("ran")
    assert go == 0, events
    assert ran == go + 1, events  # no fsync between the go-ahead and the job's exec


def test_the_job_is_forked_and_set_up_before_the_go_ahead(status_dir: Path) -> None:
    """The job's fork and its own steps up to its exec overlap the service's commit of
    the start: the job's process is there before the go-ahead, and no marker yet."""
    seen: dict[str, object] = {}

    def recorded(supervisor: int, since: int) -> None:
        children = Path(f"/proc/{supervisor}/task/{supervisor}/children")
        wait_for(lambda: children.read_text().split(), 30, "the job's process")
        seen["job"] = int(children.read_text().split()[0])
        seen["marker"] = spawn.read_marker(str(status_dir), "7")

    started = spawn.start(launch(status_dir, ["true"]), on_forked=recorded)
    assert seen == {"job": started.pid, "marker": None}
    assert ended(status_dir).ok


def test_a_job_set_up_without_its_go_ahead_never_runs(status_dir: Path, tmp_path: Path) -> None:
    """A service that dies before its commit: the job's process, forked already, ends
    at its closed pipe without running anything, and nothing of it is left."""
    ran = tmp_path / "ran"

    def refused(supervisor: int, since: int) -> None:
        children = Path(f"/proc/{supervisor}/task/{supervisor}/children")
        wait_for(lambda: children.read_text().split(), 30, "the job's process")
        raise RuntimeError("the journal refused the start")

    with pytest.raises(RuntimeError):
        spawn.start(launch(status_dir, ["touch", str(ran)]), on_forked=refused)
    wait_for(lambda: not os.listdir(status_dir), 30, "the room and the marker's data removed")
    assert not ran.exists()


def test_a_marker_whose_data_a_power_cut_lost_says_the_job_may_have_run(
    status_dir: Path,
) -> None:
    """Neither the marker's name nor its data is waited onto the disk: after a power cut
    the name may be there with nothing in it. That reads as a marker ({}: the job may
    have run, so it is never queued again), not as no marker (None)."""
    assert spawn.read_marker(str(status_dir), "7") is None
    Path(spawn.marker_path(str(status_dir), "7")).write_text("")
    assert spawn.read_marker(str(status_dir), "7") == {}
