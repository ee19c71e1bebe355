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
import signal
import sqlite3
import stat
import time
from collections.abc import Mapping
from typing import Any, Optional

from gpuwarden import config
from gpuwarden.base.errors import UserError
from gpuwarden.service import (
    archive,
    healthwatch,
    journalguard,
    reloading,
    store,
    timelimits,
    unwritten,
)
from gpuwarden.service.clients import Clients
from gpuwarden.service.connection import Connection
from gpuwarden.service.machine import Machine
from gpuwarden.service.notify import JobNotifier
from gpuwarden.service.pacing import FULL, Pacer
from gpuwarden.service.reloading import read_settings
from gpuwarden.service.requests import Requests
from gpuwarden.service.settings import Settings

log = logging.getLogger("gpuwarden.serve")


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
        self.clients = Clients(self.selector, self._answer, self._client_left)
        self.attachments = self.clients.attachments
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
        self.clients.listen(path)  # anyone may ask; the kernel says who asked
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
        if self.clients.listener is not None:
            with contextlib.suppress(OSError):
                os.unlink(self.settings.socket)
        self.clients.close()
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
                self.clients.accept(self.settings)
            elif kind == "client":
                self.clients.ready(data, mask)
            elif kind == "job":
                self._ended(data)
        if time.monotonic() >= self.next_tick:
            self.next_tick = time.monotonic() + self.settings.tick
            self._tick()

    # -- clients -----------------------------------------------------------------------

    def _answer(self, client: Connection, message: Mapping[str, Any]) -> dict[str, Any]:
        """A request answered, or refused in one line: a bug in one answer, or a journal
        that cannot be written, does not take the queue down with it."""
        try:
            return self.handle(client.who, message, client)
        except UserError as err:
            return {"ok": False, "error": str(err)}
        except sqlite3.Error as err:
            log.error("request %r refused: %s", message.get("op"), err)
            return {"ok": False, "error": journal_failure(self.store.path, err)}
        except Exception as err:
            log.exception("request %r failed", message.get("op"))
            return {"ok": False, "error": f"internal error: {type(err).__name__}"}

    def _client_left(self, job_id: int) -> None:
        """An attached client went away (its terminal closed, it was killed): its job
        ends too, as a job started from a shell would."""
        job = None if self.stopping else self.store.get(job_id)
        if job is None or job.state not in store.ACTIVE:
            return
        log.info("job %s: its attached client left; cancelling it", job_id)
        self._cancel(job)

    def _tick(self) -> None:
        unwritten.retry(self)  # ends a full disk kept: written once it has room
        archive.tend(self, time.time())  # service.keep_history
        now = time.monotonic()
        self.clients.idle(now, self.settings.idle_timeout)
        timelimits.tick(self)
        if self.store.jobs([store.PENDING]):
            self.pacer.touch()  # GPUs freed outside the queue show up on the next pass

    # -- requests ----------------------------------------------------------------------

    # -- scheduling --------------------------------------------------------------------
