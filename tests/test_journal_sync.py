"""The journal's fsync off the loop's thread (service.journalsync): what waits on it
(a submit's answer, a start's go-ahead) goes on only once a sync that began after its
commit is done, and the loop never waits in it.

The log's fdatasync is held here until the test lets it go: an answer or a go-ahead
given before then fails the test, as one given before the thread's fsync was done
would on a real disk."""

from __future__ import annotations

import os
import select
import selectors
import socket
import threading
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from gpuwarden.queueclient import protocol
from gpuwarden.service import placing, spawn, starting
from gpuwarden.service import store as s
from gpuwarden.service.clients import Clients
from gpuwarden.service.connection import Connection
from gpuwarden.service.identity import Person


class HeldSync:
    """`os.fdatasync`, counted by thread, each call held until `let_go` (or failing)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.threads: list[str] = []
        self.gate = threading.Semaphore(0)
        self.fail = False
        self.free = False  # from now on, each passes at once
        real = os.fdatasync

        def held(fd: int) -> None:
            self.threads.append(threading.current_thread().name)
            if not self.free:
                assert self.gate.acquire(timeout=30), "the test never let the fsync go"
            if self.fail:
                raise OSError(5, "Input/output error")
            real(fd)

        monkeypatch.setattr(os, "fdatasync", held)

    def let_go(self) -> None:
        self.gate.release()


@pytest.fixture
def journal(tmp_path: Path) -> Iterator[s.Store]:
    store = s.Store(str(tmp_path / "jobs.db"))
    yield store
    store.close()


def done(store: s.Store) -> None:
    """The loop's turn that hears the sync is done (server: the "synced" event)."""
    ready, _, _ = select.select([store.syncer.event], [], [], 30)
    assert ready, "the sync never said it was done"
    store.syncer.finished()


def waiting(job_id: int, store: s.Store) -> None:
    store.update(job_id, durable=False, reason="x")  # a commit left for the fsync


def test_a_sync_runs_off_the_loop_and_later_waiters_share_the_next(
    journal: s.Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    held = HeldSync(monkeypatch)
    job = journal.add(s.new_job(**JOB))
    told: list[str] = []
    waiting(job.id, journal)
    journal.when_durable(lambda ok: told.append(f"first {ok}"))
    waiting(job.id, journal)  # after the sync in flight began: the next one's
    journal.when_durable(lambda ok: told.append(f"second {ok}"))
    journal.when_durable(lambda ok: told.append(f"third {ok}"))
    assert told == [] and journal.unsynced  # the loop goes on
    held.let_go()
    done(journal)
    assert told == ["first True"]  # the second commit was made after it began
    held.let_go()
    done(journal)
    assert told == ["first True", "second True", "third True"] and not journal.unsynced
    assert held.threads == ["journal-sync", "journal-sync"]  # one in flight at a time
    assert journal.syncer.on_loop == 0 and journal.syncer.synced == 2
    journal.when_durable(lambda ok: told.append(f"now {ok}"))  # nothing to sync: at once
    assert told[-1] == "now True" and len(held.threads) == 2


def test_a_failed_sync_promises_nothing(journal: s.Store, monkeypatch: pytest.MonkeyPatch) -> None:
    held = HeldSync(monkeypatch)
    job = journal.add(s.new_job(**JOB))
    waiting(job.id, journal)
    told: list[bool] = []
    journal.when_durable(told.append)
    held.fail = True
    held.let_go()
    done(journal)
    assert told == [False] and journal.unsynced and journal.syncer.failures == 1
    held.fail = False
    journal.when_durable(told.append)  # the next asks again
    held.let_go()
    done(journal)
    assert told == [False, True] and not journal.unsynced


def test_closing_waits_for_the_sync_in_flight(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    held = HeldSync(monkeypatch)
    journal = s.Store(str(tmp_path / "jobs.db"))
    job = journal.add(s.new_job(**JOB))
    waiting(job.id, journal)
    told: list[bool] = []
    journal.when_durable(told.append)
    threading.Timer(0.2, held.let_go).start()
    journal.close()
    assert told == [True] and held.threads == ["journal-sync"]


def test_no_answer_leaves_before_its_sync_is_done(
    journal: s.Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A submit's answer, through the clients as the loop drives them: nothing reaches
    the client until the fsync that began after its commit is done."""
    held = HeldSync(monkeypatch)
    selector = selectors.DefaultSelector()
    job = journal.add(s.new_job(**JOB))

    def answer(client: Connection, message: Any) -> dict[str, Any]:
        client.promised = True
        waiting(job.id, journal)
        return {"ok": True, "job": job.id}

    clients = Clients(selector, answer, lambda _: None)
    ours, theirs = socket.socketpair()
    ours.setblocking(False)
    theirs.setblocking(False)
    client = Connection(ours, Person(os.getuid(), os.getgid(), "ada", ()))
    clients.open[ours.fileno()] = client
    theirs.sendall(protocol.encode({"v": protocol.VERSION, "op": "submit"}))
    clients.ready(client, selectors.EVENT_READ)
    clients.release(journal.when_durable)
    with pytest.raises(BlockingIOError):
        theirs.recv(1)
    held.let_go()
    ready, _, _ = select.select([theirs], [], [], 0.3)
    assert not ready, "an answer left before the loop heard its sync was done"
    done(journal)
    assert protocol.Decoder().feed(theirs.recv(65536))[0]["job"] == job.id
    clients.close()
    theirs.close()
    selector.close()


@pytest.mark.parametrize("fails", [False, True])
def test_a_go_ahead_waits_for_its_start_record_on_disk(
    journal: s.Store, monkeypatch: pytest.MonkeyPatch, fails: bool
) -> None:
    """The starts of a pass get their go-ahead once one fsync made their STARTING
    records durable; none (their supervisors told to run nothing) when it fails; a
    cancel meanwhile waits for the job's exec, as one while it sets itself up."""
    held = HeldSync(monkeypatch)
    held.fail = fails
    selector = selectors.DefaultSelector()
    life = SimpleNamespace(store=journal, starts=starting.Starts(), selector=selector)
    pipes, starts = [], []
    for _ in range(2):
        job = journal.add(s.new_job(**JOB))
        journal.update(job.id, durable=False, state=s.STARTING)
        report_r, report_w = os.pipe()
        go_r, go_w = os.pipe()
        pipes.append((go_r, report_w))
        forked = spawn.Forked(os.getpid(), report_r, go_w)
        starts.append(starting.Starting(job.id, forked, None, (), 0.0))  # type: ignore[arg-type]
    placing.go(life, starts)  # type: ignore[arg-type]
    assert all(life.starts.before_exec(st.job) for st in starts)
    assert not life.starts.flight and select.select([p[0] for p in pipes], [], [], 0.2)[0] == []
    held.let_go()
    done(journal)
    assert [os.read(go_r, 1) for go_r, _ in pipes] == [b"" if fails else b"g"] * 2
    assert sorted(life.starts.flight) == sorted(st.job for st in starts)
    assert not life.starts.waiting
    held.fail, held.free = False, True  # the journal closes
    for start, (go_r, report_w) in zip(starts, pipes):
        selector.unregister(start.forked.report)
        for fd in (go_r, report_w, start.forked.report):
            os.close(fd)
    selector.close()


JOB: dict[str, Any] = {
    "uid": 1000,
    "gid": 1000,
    "user": "alice",
    "argv": ("true",),
    "cwd": "/",
    "env": {},
    "umask": 0o022,
    "request": {"count": 1},
    "submitted": 0.0,
}
