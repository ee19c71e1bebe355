"""The socket loop's own state (service.clients), driven without a service: the
clients are handed how to answer and what to do when an attached client leaves,
and own every connection and attachment themselves."""

from __future__ import annotations

import os
import selectors
import socket
from collections.abc import Iterator, Mapping
from typing import Any

import pytest

from gpuwarden.queueclient import protocol
from gpuwarden.service.clients import Clients
from gpuwarden.service.connection import Connection
from gpuwarden.service.identity import Person


class Loop:
    """A `Clients` over a selector, answering every request with its op, and the jobs
    it was told ended because their client left."""

    def __init__(self) -> None:
        self.selector = selectors.DefaultSelector()
        self.left: list[int] = []
        self.clients = Clients(self.selector, self.answer, self.left.append)
        self.peers: list[socket.socket] = []

    @staticmethod
    def answer(client: Connection, message: Mapping[str, Any]) -> dict[str, Any]:
        return {"ok": True, "op": message["op"], "user": client.who.name}

    def connect(self) -> tuple[Connection, socket.socket]:
        """One connection as `accept` makes it, and its peer's end."""
        ours, theirs = socket.socketpair()
        ours.setblocking(False)
        who = Person(os.getuid(), os.getgid(), "ada", (os.getgid(),))
        client = Connection(ours, who)
        self.clients.open[ours.fileno()] = client
        self.clients.per_uid[who.uid] = self.clients.per_uid.get(who.uid, 0) + 1
        self.selector.register(ours, selectors.EVENT_READ, ("client", client))
        self.peers.append(theirs)
        return client, theirs


@pytest.fixture
def loop() -> Iterator[Loop]:
    made = Loop()
    yield made
    made.clients.close()
    for peer in made.peers:
        peer.close()
    made.selector.close()


def received(peer: socket.socket) -> list[dict[str, Any]]:
    return protocol.Decoder().feed(peer.recv(65536))


def terminal() -> list[int]:
    read, write = os.pipe()
    return [read, write, os.dup(write)]


def closed(fd: int) -> bool:
    try:
        os.fstat(fd)
    except OSError:
        return True
    return False


def test_a_request_is_answered_by_the_function_the_clients_were_given(loop: Loop) -> None:
    client, peer = loop.connect()
    peer.sendall(protocol.encode({"v": protocol.VERSION, "op": "hello"}))
    loop.clients.ready(client, selectors.EVENT_READ)
    assert received(peer) == [{"ok": True, "op": "hello", "user": "ada", "v": protocol.VERSION}]


def test_an_attached_client_that_leaves_ends_its_job_and_its_terminal_is_closed(
    loop: Loop,
) -> None:
    client, peer = loop.connect()
    stdio = terminal()
    loop.clients.attachments.hold(7, client, stdio)
    loop.clients.attachments.notify(7, {"event": "started"})
    assert received(peer) == [{"ok": True, "job": 7, "event": "started", "v": protocol.VERSION}]
    peer.close()
    loop.clients.ready(client, selectors.EVENT_READ)  # end of file: it left
    assert loop.left == [7]
    assert not loop.clients.open and not loop.clients.per_uid
    assert 7 not in loop.clients.attachments.attached and all(closed(fd) for fd in stdio)


def test_a_closing_service_lets_attached_jobs_run_on(loop: Loop) -> None:
    client, _ = loop.connect()
    loop.clients.attachments.hold(8, client, None)
    loop.clients.close()
    assert loop.left == [] and not loop.clients.open


def test_an_ended_job_lets_go_of_its_client(loop: Loop) -> None:
    client, peer = loop.connect()
    stdio = terminal()
    loop.clients.attachments.hold(9, client, stdio)
    loop.clients.attachments.ended(9)
    assert client.job is None and all(closed(fd) for fd in stdio)
    peer.close()
    loop.clients.ready(client, selectors.EVENT_READ)
    assert loop.left == []  # its job had ended: nothing to cancel


def promising(client: Connection, message: Mapping[str, Any]) -> dict[str, Any]:
    """An answer that promises a journaled job, as service.submitting's."""
    client.promised = True
    return {"ok": True, "job": 1}


def test_an_answer_that_promises_a_job_leaves_only_after_the_fsync(loop: Loop) -> None:
    """Every submit answered in a turn of the loop waits for one fsync at its end
    (server.step), then all leave: no id is told before it is on disk."""
    loop.clients.answer = promising
    first, one = loop.connect()
    second, other = loop.connect()
    one.sendall(protocol.encode({"v": protocol.VERSION, "op": "submit"}) * 2)
    other.sendall(protocol.encode({"v": protocol.VERSION, "op": "submit"}))
    loop.clients.ready(first, selectors.EVENT_READ)
    loop.clients.ready(second, selectors.EVENT_READ)
    one.setblocking(False)
    with pytest.raises(BlockingIOError):
        one.recv(1)  # nothing told yet
    synced: list[bool] = []
    loop.clients.release(lambda: synced.append(True))
    assert synced == [True]  # one fsync for the three
    assert [r["job"] for r in received(one)] == [1, 1]
    assert [r["job"] for r in received(other)] == [1]
    loop.clients.release(lambda: synced.append(True))
    assert synced == [True]  # nothing held: no fsync


def test_when_the_fsync_fails_nothing_is_promised(loop: Loop) -> None:
    loop.clients.answer = promising
    client, peer = loop.connect()
    peer.sendall(protocol.encode({"v": protocol.VERSION, "op": "submit"}))
    loop.clients.ready(client, selectors.EVENT_READ)

    def failing() -> None:
        raise OSError(5, "Input/output error")

    with pytest.raises(OSError):
        loop.clients.release(failing)
    assert peer.recv(65536) == b""  # the connection closed, no answer
    assert not loop.clients.is_open(client)
