"""A full disk under the root service's journal loses nothing, with real Unix accounts.

The state directory is a small tmpfs filled to the last byte, as a disk that a job's
output or another service filled. A job that ends meanwhile keeps its exit record (its
room was taken before it started: service.spawn), its end is written once the disk has
room (service.unwritten) and the GPUs it held go to the next job then, without waiting
for anything else; `cancel` works throughout; a restart never calls a job that exited
LOST.
"""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuwarden.service.forker import SPARES
from servicetools import Server, cli_as, serving, submit
from smalldisk import fill, small_disk
from users import make_user
from waiting import wait_for

ALL_GPUS = {"count": 4}  # the simulated machine's four: one job at a time


def settled(srv: Server) -> Path:
    """The state directory once every spare supervisor has made its job's files there
    (service.staging), so that the disk filled next stays full: a spare that cannot
    make them removes what it made, freeing room, which is right, but not while a test
    says no byte is free."""
    jobs = Path(srv.state, "jobs")
    staged = lambda: len(list(jobs.glob(".supervisor-*")))  # noqa: E731
    wait_for(lambda: staged() == 2 * SPARES, 30, lambda: f"the spares' files: {staged()}")
    return Path(srv.state)


def _wait_flag(flag: Path) -> list[str]:
    """A job that runs until `flag` exists, then exits 0."""
    return ["sh", "-c", f"while [ ! -e {flag} ]; do sleep 0.1; done"]


@pytest.fixture
def tiny(tmp_path: Path, open_dir: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Server]:
    """The service with its state directory on a 4 MiB tmpfs."""
    with small_disk(tmp_path / "service", "4m") as state:
        gen = serving(tmp_path, open_dir, monkeypatch)
        try:
            yield next(gen)
        finally:
            (state / "filler").unlink(missing_ok=True)
            with contextlib.suppress(StopIteration):
                next(gen)


def test_a_job_that_ends_on_a_full_disk_is_recorded_when_space_returns_and_cancel_works(
    tiny: Server,
) -> None:
    srv = tiny
    alice, bob = make_user("alice", ("lab",)), make_user("bob")
    flag = srv.work / "done-a"
    first = submit(srv, alice, _wait_flag(flag), request=ALL_GPUS)
    srv.wait_state(first, ("RUNNING",))
    nxt = submit(srv, bob, ["true"], request=ALL_GPUS)  # waits for the four GPUs
    doomed = submit(srv, alice, ["true"], request=ALL_GPUS)
    filler = fill(settled(srv))

    # cancel of a waiting job, through the CLI a user types, on the full disk
    done = cli_as(srv, alice, "cancel", str(doomed))
    assert done.returncode == 0 and "cannot rollback" not in done.stderr, done.stderr

    flag.touch()  # the first job exits 0 while no byte is free
    srv.wait_log(f"job {first}: its end is kept until the journal can take it")
    record = Path(srv.state, "jobs", f"{first}.exit")
    assert record.exists(), os.listdir(record.parent)  # written into its reserved room
    refused = srv.call(alice, "submit", argv=["true"], cwd=str(srv.work), env={})
    assert refused["error"].startswith("refused: the disk of the service's journal is full")
    assert srv.call(bob, "hello")["user"] == "gw-bob"  # it serves on

    filler.unlink()  # space returns: the end is written, the next job starts
    row = srv.wait_state(first, ("COMPLETED", "FAILED", "LOST"))
    assert (row["state"], row["exit_code"]) == ("COMPLETED", 0), row
    assert srv.wait_state(nxt, ("COMPLETED",))["exit_code"] == 0
    gone = srv.wait_state(doomed, ("CANCELLED", "COMPLETED"))
    assert gone["state"] == "CANCELLED" and gone["started"] is None, gone
    wait_for(lambda: not record.exists(), 30, "the exit record removed once its end is written")


def test_a_restart_on_a_full_disk_finds_how_the_job_ended(tiny: Server) -> None:
    srv = tiny
    alice = make_user("alice", ("lab",))
    flag = srv.work / "done-b"
    job = submit(srv, alice, _wait_flag(flag), request={"count": 2})
    srv.wait_state(job, ("RUNNING",))
    running = submit(srv, alice, ["sleep", "300"], request={"count": 2})
    srv.wait_state(running, ("RUNNING",))
    filler = fill(settled(srv))

    # cancel of a running job on the full disk: it is signalled, and ends cancelled
    done = cli_as(srv, alice, "cancel", str(running))
    assert done.returncode == 0 and "cannot rollback" not in done.stderr, done.stderr
    flag.touch()
    srv.wait_log(f"job {job}: its end is kept until the journal can take it")
    srv.kill(signal.SIGKILL)  # a crash before the disk has room
    filler.unlink()
    srv.start()
    row = srv.wait_state(job, ("COMPLETED", "FAILED", "LOST"))
    assert (row["state"], row["exit_code"], row["error"]) == ("COMPLETED", 0, None), row
    ended = srv.wait_state(running, ("CANCELLED", "FAILED", "COMPLETED", "LOST"))
    # its SIGTERM, never LOST (a crash before the disk had room forgets only that the
    # signal was a cancel's: docs/threat-model.md)
    assert ended["state"] in ("CANCELLED", "FAILED") and ended["signal"] == 15, ended


def test_a_full_disk_refuses_the_request_and_the_service_serves_on(tiny: Server) -> None:
    srv = tiny
    alice, bob = make_user("alice", ("lab",)), make_user("bob")
    held = submit(srv, alice, ["true"], hold=True)
    filler = fill(settled(srv))
    refused = srv.call(alice, "submit", argv=["true"], cwd=str(srv.work), env={})
    assert refused["error"].startswith("refused: the disk of the service's journal is full")
    unheld = srv.call(alice, "release", jobs=[held])
    assert unheld["error"].startswith("refused: the disk of the service's journal is full")
    assert srv.call(bob, "hello")["user"] == "gw-bob"
    assert [r["id"] for r in srv.call(bob, "queue")["jobs"]] == [held]  # reads still work
    filler.unlink()
    assert srv.call(alice, "release", jobs=[held])["jobs"] == [held]
    assert srv.wait_state(held, ("COMPLETED",))["state"] == "COMPLETED"
    job = submit(srv, alice, ["true"])
    assert srv.wait_state(job, ("COMPLETED",))["state"] == "COMPLETED"
