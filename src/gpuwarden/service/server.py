"""`gpuwarden serve`: the socket loop that owns the queue on a shared machine.

One thread, one `selectors` loop: client sockets, one pidfd per running job's
supervisor (readable when it ends, also for supervisors adopted after a restart),
and a tick for time limits and GPUs freed by processes outside the queue. After
an event that may start a job (and, coalesced, after others: service.pacing)
`schedule()` asks `scheduling.plan` what starts, takes the leases for
it in the service's own lease directory, records the job as STARTING, forks its
supervisor (service.spawn), and records it RUNNING. docs/service.md has the design.
"""

from __future__ import annotations

import contextlib
import logging
import os
import selectors
import signal
import socket
import sqlite3
import stat
import time
from typing import Any, Optional

from gpuwarden import config
from gpuwarden.base.errors import UserError
from gpuwarden.queueclient import protocol
from gpuwarden.queueclient.protocol import ProtocolError
from gpuwarden.service import (
    archive,
    healthwatch,
    journalguard,
    reloading,
    store,
    timelimits,
    unwritten,
)
from gpuwarden.service.connection import Connection
from gpuwarden.service.identity import Person, peer
from gpuwarden.service.machine import Machine
from gpuwarden.service.notify import JobNotifier
from gpuwarden.service.pacing import FULL, Pacer
from gpuwarden.service.reloading import read_settings
from gpuwarden.service.requests import Requests
from gpuwarden.service.settings import Settings

log = logging.getLogger("gpuwarden.serve")


#: Answers queued for one client before it is dropped (it does not read them).
MAX_PENDING = 2 * protocol.MAX_MESSAGE
#: A client's next request is answered only once fewer bytes than this wait for it.
BACKLOG_OUT = protocol.PAGE_BYTES


def _directory(path: str) -> None:
    """Make the service's folder `path` (0700) unless it is there; one line when it
    cannot be (a file or a dangling link in its place, a parent that is a file)."""
    try:
        os.makedirs(path, mode=0o700, exist_ok=True)
    except FileExistsError:
        raise UserError(
            f"{path} exists and is not a directory; the service did not start"
        ) from None
    except OSError as err:
        raise UserError(f"cannot make the directory {path}: {err.strerror}") from None


def journal_failure(path: str, err: Exception) -> str:
    """A request the journal could not record, in one line: the full disk named."""
    text = str(err)
    if "full" in text:
        return f"refused: the disk of the service's journal is full ({path}); nothing was changed"
    return f"refused: the service's journal could not be written ({path}: {text})"


class Service(Requests):
    """The queue service: its state (service.core) and every concern's methods, with
    the socket loop that serves them."""

    def __init__(self, settings: Settings, hardware: Optional[Machine] = None) -> None:
        super().__init__(
            settings,
            hardware or Machine(),
            JobNotifier(settings.webhook, settings.sendmail),
            Pacer(),
        )
        self.health: Any = None  # the health watch (service.healthwatch), from `open`
        for folder in (settings.state_dir, self.exits):
            _directory(folder)
        journal = os.path.join(settings.state_dir, "jobs.db")
        try:
            # Held for the service's life: a second service refuses (service.journalguard).
            self.locks.append(journalguard.lock(journal + ".lock", f"the journal {journal}"))
            journalguard.refuse_damaged(journal)
            try:
                self.store = store.Store(journal)
            except sqlite3.Error as err:  # a full or read-only disk: said, not a traceback
                raise UserError(f"cannot open the journal {journal}: {err}") from None
            try:  # a history batch a crash interrupted (service.archive)
                archive.recover(self.store, settings.state_dir)
            except OSError as err:
                log.warning("an interrupted history archive could not be settled: %s", err)
        except BaseException:
            for fd in self.locks:
                os.close(fd)
            self.selector.close()
            raise

    @classmethod
    def configured(
        cls,
        options: dict[str, Any],
        fixed: dict[str, Any],
        admins: tuple[str, ...],
        hardware: Optional[Machine] = None,
    ) -> Service:
        """The service `gpuwarden serve` starts: its settings from the configuration
        with the command line's values over it, kept for every reload."""
        service = cls(read_settings(options, fixed, admins), hardware)
        service.options, service.fixed, service.extra_admins = options, fixed, admins
        return service

    # -- life cycle --------------------------------------------------------------------

    def open(self) -> None:
        """Bind the socket (replacing a stale one) and re-adopt the journal's jobs."""
        path = self.settings.socket
        folder = os.path.dirname(path) or "."
        os.makedirs(folder, mode=0o755, exist_ok=True)
        self.locks.append(journalguard.lock(path + ".lock", f"the socket {path}"))
        with contextlib.suppress(FileNotFoundError):
            st = os.lstat(path)
            if not stat.S_ISSOCK(st.st_mode):
                raise UserError(f"{path} exists and is not a socket; refusing to replace it")
            os.unlink(path)
        self.notifier.start()  # a fork: before anything else runs
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(path)
        os.chmod(path, 0o666)  # anyone may ask; the kernel says who asked
        listener.listen(128)
        listener.setblocking(False)
        self.listener = listener
        self.selector.register(listener, selectors.EVENT_READ, ("listen", None))
        snapshot = self.machine = self.read_snapshot()
        self.reading = config.load()
        self.queue.seen(snapshot.gpus)
        self.recover()
        # Its threads start after every fork of the start (the notifier's): a lab with
        # no exporter still has a fatal fault drained (service.healthwatch).
        self.health = healthwatch.start(self.reading, self.settings.webhook)
        log.info("serving on %s", path)

    def close(self) -> None:
        """Stop serving. Jobs run on, attached ones too: their clients reconnect to the
        next service (service.attachment)."""
        self.stopping = True
        for client in list(self.clients.values()):
            self._drop(client)
        if self.listener is not None:
            self.selector.unregister(self.listener)
            self.listener.close()
            with contextlib.suppress(OSError):
                os.unlink(self.settings.socket)
        for fd in [*self.watched.values(), *self.processes.values()]:
            os.close(fd)
        self.watched.clear()
        self.processes.clear()
        if self.health is not None:
            self.health.stop()
        self.notifier.close()
        self.store.close()
        for fd in self.locks:  # the lock files stay: removing a held one would race
            os.close(fd)
        self.locks.clear()
        if self.settings.devices != "off" and self.cgroup_mode != "none":
            from gpuwarden.service.jobcgroup import remove_scope, scope_of

            remove_scope(scope_of(self.exits))

    def serve_forever(self) -> None:
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: setattr(self, "stopping", True))
        signal.signal(signal.SIGHUP, lambda *_: setattr(self, "reload_asked", True))
        self.open()
        last, quiet_until, again = "", 0.0, False  # a full disk fails turn after turn alike
        try:
            while not self.stopping:
                try:
                    self.step()
                    again = False
                except Exception as err:  # one turn's failure (a full disk, a bug) is not fatal
                    said, now = f"{type(err).__name__}: {err}", time.monotonic()
                    if said != last or now >= quiet_until:  # its traceback once a minute
                        log.exception("a turn of the service loop failed; serving on")
                        last, quiet_until = said, now + 60.0
                    if again:  # failing turn after turn: not a busy loop of one error
                        time.sleep(min(1.0, self.settings.tick))
                    again = True
        finally:
            self.close()

    def step(self, timeout: Optional[float] = None) -> None:
        """One turn of the loop: plan if a pass is due (service.pacing: a start pass at
        once after anything that may start a job), wait for events (at most until the
        next pass or tick), handle them, and do the tick's work once a tick has passed:
        none of it grows with requests."""
        reloading.reload_if_asked(self)
        kind = self.pacer.due(time.monotonic())
        if kind is not None:
            self.pacer.begin(kind)
            self.schedule(full=kind == FULL)
            self.remove_litter()
        now = time.monotonic()
        longest = max(0.0, min(self.settings.tick, self.next_tick - now))
        wait = self.pacer.wait(now, longest if timeout is None else timeout)
        if wait > 0 and self.pacer.urgent:
            self.pacer.deferred += 1  # a start waiting: none may (tests/test_service_counts.py)
        for key, mask in self.selector.select(wait):
            kind, data = key.data
            if kind == "listen":
                self._accept()
            elif kind == "client":
                if mask & selectors.EVENT_WRITE:
                    self._flush(data)
                    if data.backlog:
                        self._serve(data)
                if mask & selectors.EVENT_READ and self._open(data):
                    self._read(data)
            elif kind == "job":
                self._ended(data)
        if time.monotonic() >= self.next_tick:
            self.next_tick = time.monotonic() + self.settings.tick
            self._tick()

    # -- recovery ----------------------------------------------------------------------

    # -- clients -----------------------------------------------------------------------

    def _accept(self) -> None:
        assert self.listener is not None
        while True:
            try:
                sock, _ = self.listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            try:
                who = peer(sock)
                self._admit(who)
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
            self.clients[sock.fileno()] = client
            self.per_uid[who.uid] = self.per_uid.get(who.uid, 0) + 1
            self.selector.register(sock, selectors.EVENT_READ, ("client", client))

    def _admit(self, who: Person) -> None:
        """Refuse a connection over the bounds, in one line naming the bound: one user's
        connections (so that no user fills the service's), and everyone's."""
        s = self.settings
        mine = self.per_uid.get(who.uid, 0)
        if mine >= s.max_clients_per_user:
            raise UserError(
                f"you have {mine} connections open to the service, the most one user may "
                "(service.max_connections_per_user)"
            )
        if len(self.clients) >= s.max_clients:
            raise UserError(
                f"the service has {len(self.clients)} connections open, the most it serves; "
                "try again shortly"
            )

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
            self._drop(client)
            return
        try:
            client.backlog.extend(client.decoder.feed(data))
        except protocol.ProtocolError as err:
            self._send(client, {"ok": False, "error": str(err)})
            self._drop(client)
            return
        self._serve(client)

    def _serve(self, client: Connection) -> None:
        """Answer the client's waiting requests while what it has yet to read is small:
        a client that sends many and reads none is not read from (nor answered) until it
        reads, so what waits for it stays bounded."""
        while client.backlog and len(client.out) < BACKLOG_OUT and self._open(client):
            message = client.backlog.pop(0)
            client.seen = time.monotonic()  # a whole request: a byte a while is not one
            try:
                reply = self.handle(client.who, message, client)
            except UserError as err:
                reply = {"ok": False, "error": str(err)}
            except sqlite3.Error as err:
                reply = {"ok": False, "error": journal_failure(self.store.path, err)}
                log.error("request %r refused: %s", message.get("op"), err)
            except Exception as err:  # a bug must not take the queue down with it
                log.exception("request %r failed", message.get("op"))
                reply = {"ok": False, "error": f"internal error: {type(err).__name__}"}
            self._send(client, reply)
        if self._open(client):
            self._flush(client)

    def _open(self, client: Connection) -> bool:
        return self.clients.get(client.sock.fileno()) is client

    def _send(self, client: Connection, reply: dict[str, Any]) -> None:
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
            self._drop(client)
            return
        self._flush(client)

    def _flush(self, client: Connection) -> None:
        try:
            while client.out:
                sent = client.sock.send(client.out)
                del client.out[:sent]
                client.out_since = time.monotonic()
        except (BlockingIOError, InterruptedError):
            pass
        except OSError:
            self._drop(client)
            return
        if not self._open(client):
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

    def _drop(self, client: Connection) -> None:
        fd = client.sock.fileno()
        if self.clients.get(fd) is client:
            del self.clients[fd]
            left = self.per_uid.get(client.who.uid, 1) - 1
            if left > 0:
                self.per_uid[client.who.uid] = left
            else:
                self.per_uid.pop(client.who.uid, None)
            with contextlib.suppress(KeyError, ValueError):
                self.selector.unregister(client.sock)
        client.sock.close()
        client.close_fds()
        if client.job is not None and not self.stopping:
            self._detach(client.job)

    def _detach(self, job_id: int) -> None:
        """An attached client went away (its terminal closed, it was killed): its job
        ends too, as a job started from a shell would, and its descriptors are closed."""
        self.attached.pop(job_id, None)
        self.release_stdio(job_id)
        job = self.store.get(job_id)
        if job is None or job.state not in store.ACTIVE:
            return
        log.info("job %s: its attached client left; cancelling it", job_id)
        self._cancel(job)

    def notify_attached(self, job_id: int, event: dict[str, Any]) -> None:
        client = self.attached.get(job_id)
        if client is not None:
            self._send(client, {"ok": True, "job": job_id, **event})

    def _tick(self) -> None:
        unwritten.retry(self)  # ends a full disk kept: written once it has room
        archive.tend(self, time.time())  # service.keep_history
        now = time.monotonic()
        for client in list(self.clients.values()):
            if client.job is None and now - client.seen > self.settings.idle_timeout:
                self._drop(client)
            elif client.out and now - client.out_since > self.settings.idle_timeout:
                self._drop(client)  # it stopped reading its answers
        timelimits.tick(self)
        if self.store.jobs([store.PENDING]):
            self.pacer.touch()  # GPUs freed outside the queue show up on the next pass

    # -- requests ----------------------------------------------------------------------

    # -- scheduling --------------------------------------------------------------------
