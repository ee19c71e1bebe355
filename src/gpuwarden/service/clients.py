"""The service's clients: its listening socket, their connections, and their attached jobs.

The socket loop's state, owned here and nowhere else: which connections are open
(and how many per user), what each has yet to read, and which waits on an attached
job (service.attachment). It is given, explicitly, the selector the server waits on,
how a request is answered (`answer`: never raises), and what to do when an attached
client goes away (`left`: its job ends too). Every bound a client can press on is
named here: connections per user and in all, the answers piled up for a client that
does not read them, the time a client may stay silent.
"""

from __future__ import annotations

import contextlib
import logging
import os
import selectors
import socket
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Optional

from gpuwarden.base.errors import UserError
from gpuwarden.queueclient import protocol
from gpuwarden.queueclient.protocol import ProtocolError
from gpuwarden.service.attachment import Attachments
from gpuwarden.service.connection import Connection
from gpuwarden.service.identity import Person, peer

if TYPE_CHECKING:
    from gpuwarden.service.settings import Settings

log = logging.getLogger("gpuwarden.serve")

#: Answers queued for one client before it is dropped (it does not read them).
MAX_PENDING = 2 * protocol.MAX_MESSAGE
#: A client's next request is answered only once fewer bytes than this wait for it.
BACKLOG_OUT = protocol.PAGE_BYTES

#: How a request is answered: (its connection, the message) -> the reply; never raises.
Answer = Callable[[Connection, Mapping[str, Any]], dict[str, Any]]


class Clients:
    """The open connections and what waits on each, driven by the server's loop."""

    def __init__(
        self, selector: selectors.BaseSelector, answer: Answer, left: Callable[[int], None]
    ) -> None:
        self.selector = selector
        self.answer = answer
        self.left = left  # an attached client went away: its job (by id) ends too
        self.listener: Optional[socket.socket] = None
        self.open: dict[int, Connection] = {}  # socket fd -> connection
        self.per_uid: dict[int, int] = {}  # connections open per user
        self.attachments = Attachments(self.send)
        self.closing = False
        self.held: list[Connection] = []  # answers waiting for the journal's fsync

    def listen(self, path: str) -> None:
        """Listen on `path` (anyone may connect; the kernel says who did)."""
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(path)
        os.chmod(path, 0o666)
        listener.listen(128)
        listener.setblocking(False)
        self.listener = listener
        self.selector.register(listener, selectors.EVENT_READ, ("listen", None))

    def close(self) -> None:
        """Drop every connection and stop listening; attached jobs run on (their
        clients reconnect to the next service)."""
        self.closing = True
        for client in list(self.open.values()):
            self.drop(client)
        if self.listener is not None:
            self.selector.unregister(self.listener)
            self.listener.close()
            self.listener = None

    def accept(self, settings: Settings) -> None:
        assert self.listener is not None
        while True:
            try:
                sock, _ = self.listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            try:
                who = peer(sock)
                self._admit(who, settings)
            except UserError as err:
                with contextlib.suppress(OSError):
                    sock.setblocking(False)  # one short line: the socket's buffer takes it
                    sock.send(
                        protocol.encode({"v": protocol.VERSION, "ok": False, "error": str(err)})
                    )
                sock.close()
                continue
            sock.setblocking(False)
            client = Connection(sock, who)
            self.open[sock.fileno()] = client
            self.per_uid[who.uid] = self.per_uid.get(who.uid, 0) + 1
            self.selector.register(sock, selectors.EVENT_READ, ("client", client))

    def _admit(self, who: Person, s: Settings) -> None:
        """Refuse a connection over the bounds, in one line naming the bound: one user's
        connections (so that no user fills the service's), and everyone's."""
        mine = self.per_uid.get(who.uid, 0)
        if mine >= s.max_clients_per_user:
            raise UserError(
                f"you have {mine} connections open to the service, the most one user may "
                "(service.max_connections_per_user)"
            )
        if len(self.open) >= s.max_clients:
            raise UserError(
                f"the service has {len(self.open)} connections open, the most it serves; "
                "try again shortly"
            )

    def ready(self, client: Connection, mask: int) -> None:
        """The loop found `client`'s socket writable or readable (`mask`)."""
        if mask & selectors.EVENT_WRITE:
            self.flush(client)
            if client.backlog:
                self._serve(client)
        if mask & selectors.EVENT_READ and self.is_open(client):
            self._read(client)

    def _read(self, client: Connection) -> None:
        try:
            data, fds, _, _ = socket.recv_fds(client.sock, 65536, 3)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data, fds = b"", []
        client.close_fds()  # descriptors not claimed by the message they came with
        client.fds = list(fds)
        if not data:
            self.drop(client)
            return
        try:
            client.backlog.extend(client.decoder.feed(data))
        except protocol.ProtocolError as err:
            self.send(client, {"ok": False, "error": str(err)})
            self.drop(client)
            return
        self._serve(client)

    def _serve(self, client: Connection) -> None:
        """Answer the client's waiting requests while what it has yet to read is small:
        a client that sends many and reads none is not read from (nor answered) until it
        reads, so what waits for it stays bounded."""
        while client.backlog and len(client.out) < BACKLOG_OUT and self.is_open(client):
            message = client.backlog.pop(0)
            client.seen = time.monotonic()  # a whole request: a byte a while is not one
            self.send(client, self.answer(client, message))
        if self.is_open(client):
            self.flush(client)

    def is_open(self, client: Connection) -> bool:
        return self.open.get(client.sock.fileno()) is client

    def send(self, client: Connection, reply: dict[str, Any]) -> None:
        """Queue an answer and send what the socket takes now; the rest goes out as the
        client reads (the loop waits for the socket to be writable). A client that lets
        more than MAX_PENDING pile up, or reads nothing for idle_timeout, is dropped:
        nobody waits for a slow reader."""
        reply.setdefault("v", protocol.VERSION)
        try:
            data = protocol.encode(reply)
        except ProtocolError as err:  # a bug: answers are paged to fit (service.listing)
            log.error("an answer to %s was too large: %s", client.who.name, err)
            data = protocol.encode({"v": protocol.VERSION, "ok": False, "error": str(err)})
        if not client.out:
            client.out_since = time.monotonic()
        client.out += data
        if len(client.out) > MAX_PENDING:
            log.info("%s does not read its answers: dropped", client.who.name)
            self.drop(client)
            return
        self.flush(client)

    def flush(self, client: Connection) -> None:
        if client.promised:  # sent by `release`, once the journal is on disk
            if client not in self.held:
                self.held.append(client)
            return
        try:
            while client.out:
                sent = client.sock.send(client.out)
                del client.out[:sent]
                client.out_since = time.monotonic()
        except (BlockingIOError, InterruptedError):
            pass
        except OSError:
            self.drop(client)
            return
        if not self.is_open(client):
            return
        reading = not client.backlog and len(client.out) < BACKLOG_OUT
        events = (selectors.EVENT_READ if reading else 0) | (
            selectors.EVENT_WRITE if client.out else 0
        )
        with contextlib.suppress(KeyError, ValueError):
            if events:
                self.selector.modify(client.sock, events, ("client", client))
            else:  # a backlog and nothing to send: served on the next turn
                self.selector.modify(client.sock, selectors.EVENT_WRITE, ("client", client))

    def release(self, sync: Callable[[], None]) -> None:
        """Send the answers that promise a journaled job, after `sync` made every commit
        so far durable: one fsync for all the submits of a turn of the loop, however
        many clients sent them at once, and no job id told before it is on disk. When
        the fsync fails, nothing is promised: their connections are dropped (each
        client says it lost the service)."""
        if not self.held:
            return
        held, self.held = self.held, []
        try:
            sync()
        except Exception:
            for client in held:
                client.promised = False
                self.drop(client)
            raise
        for client in held:
            client.promised = False
            if self.is_open(client):
                self.flush(client)

    def drop(self, client: Connection) -> None:
        fd = client.sock.fileno()
        if self.open.get(fd) is client:
            del self.open[fd]
            left = self.per_uid.get(client.who.uid, 1) - 1
            if left > 0:
                self.per_uid[client.who.uid] = left
            else:
                self.per_uid.pop(client.who.uid, None)
            with contextlib.suppress(KeyError, ValueError):
                self.selector.unregister(client.sock)
        client.sock.close()
        client.close_fds()
        if client.job is not None and not self.closing:
            # Its terminal closed, it was killed: its job ends too, as a job started
            # from a shell would, and its descriptors are closed.
            self.attachments.left(client.job)
            self.left(client.job)

    def idle(self, now: float, timeout: float) -> None:
        """Drop the clients silent for `timeout` (an attached one may wait on its job
        as long as it runs) and those that stopped reading their answers."""
        for client in list(self.open.values()):
            if client.job is None and now - client.seen > timeout:
                self.drop(client)
            elif client.out and now - client.out_since > timeout:
                self.drop(client)  # it stopped reading its answers
