"""`gpuwarden serve`: the socket loop that owns the queue on a shared machine.

One thread, one `selectors` loop: client sockets, one pidfd per running job's
supervisor (readable when it ends, also for supervisors adopted after a restart),
and a tick for time limits and GPUs freed by processes outside the queue. After
an event that may start a job (and, coalesced, after others: service.pacing) a
pass of the plan (service.passes) asks `scheduling.plan` what starts, takes the
leases for it in the service's own lease directory, forks its supervisor
(service.spawn), records the job as STARTING and goes on; the supervisor's report
is one more descriptor of the loop, and the job RUNNING when it comes
(service.starting). docs/service.md has the design.

`Service` owns no state of the queue's: it makes the journal, the jobs' life
(service.joblife) and the clients (service.clients), hands each its collaborators,
and drives them: events to whichever owns them, requests to service.requests'
table, the tick to service.timelimits and service.archive.
"""

from __future__ import annotations

import contextlib
import logging
import os
import selectors
import signal
import sqlite3
import stat
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Optional

from gpuwarden.base.errors import UserError
from gpuwarden.service import (
    archive,
    healthwatch,
    journalguard,
    litter,
    passes,
    recovery,
    reloading,
    requests,
    starting,
    store,
    timelimits,
    unwritten,
)
from gpuwarden.service.clients import Clients
from gpuwarden.service.connection import Connection
from gpuwarden.service.context import Context
from gpuwarden.service.joblife import JobLife, exits_folder
from gpuwarden.service.machine import Machine
from gpuwarden.service.notify import JobNotifier
from gpuwarden.service.pacing import FULL, Pacer
from gpuwarden.service.reloading import Started, read_settings
from gpuwarden.service.settings import Settings

if TYPE_CHECKING:
    from gpuwarden.health.watch import HealthWatch

log = logging.getLogger("gpuwarden.serve")

#: Rounds of events a turn of the loop handles before the fsync its answers wait for:
#: requests that arrive while the first are answered join them, a few rounds at most.
GATHER = 8


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


class Service:
    """The queue service: the loop that drives the jobs' life and serves its clients."""

    def __init__(
        self,
        settings: Settings,
        hardware: Optional[Machine] = None,
        started: Optional[Started] = None,
    ) -> None:
        self.started = started or Started({}, {}, ())
        self.selector: selectors.BaseSelector = selectors.DefaultSelector()
        self.locks: list[int] = []  # the journal's and the socket's, held for its life
        self.stopping = False
        self.reload_asked = False  # SIGHUP came: reload at the next turn of the loop
        self.health: Optional[HealthWatch] = None  # from `open`
        self.litter_at_tick = 0  # the ended jobs' files waiting at the last tick
        for folder in (settings.state_dir, exits_folder(settings.state_dir)):
            _directory(folder)
        journal = self._journal(settings)
        self.clients = Clients(self.selector, self._answer, self._client_left)
        self.life = JobLife(
            settings,
            hardware or Machine(),
            JobNotifier(settings.webhook, settings.sendmail),
            Pacer(),
            journal,
            self.clients.attachments,
            self.selector,
        )
        self.context = Context(self.life, self.started)

    def _journal(self, settings: Settings) -> store.Store:
        """The journal, locked for the service's life: a second service refuses
        (service.journalguard), a damaged one is said, not opened."""
        journal = os.path.join(settings.state_dir, "jobs.db")
        try:
            self.locks.append(journalguard.lock(journal + ".lock", f"the journal {journal}"))
            journalguard.refuse_damaged(journal)
            try:
                opened = store.Store(journal)
            except sqlite3.Error as err:  # a full or read-only disk: said, not a traceback
                raise UserError(f"cannot open the journal {journal}: {err}") from None
            try:  # a history batch a crash interrupted (service.archive)
                archive.recover(opened, settings.state_dir)
            except OSError as err:
                log.warning("an interrupted history archive could not be settled: %s", err)
        except BaseException:
            for fd in self.locks:
                os.close(fd)
            self.selector.close()
            raise
        return opened

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
        started = Started(options, fixed, admins)
        return cls(read_settings(options, fixed, admins), hardware, started)

    # -- life cycle --------------------------------------------------------------------

    def open(self) -> None:
        """Bind the socket (replacing a stale one) and re-adopt the journal's jobs."""
        life = self.life
        path = life.settings.socket
        folder = os.path.dirname(path) or "."
        os.makedirs(folder, mode=0o755, exist_ok=True)
        self.locks.append(journalguard.lock(path + ".lock", f"the socket {path}"))
        with contextlib.suppress(FileNotFoundError):
            st = os.lstat(path)
            if not stat.S_ISSOCK(st.st_mode):
                raise UserError(f"{path} exists and is not a socket; refusing to replace it")
            os.unlink(path)
        life.notifier.start()  # a fork: before anything else runs
        life.forker.warm()  # it loads what a supervisor runs while the service starts up
        self.clients.listen(path)  # anyone may ask; the kernel says who asked
        snapshot = life.machine = life.read_snapshot()
        life.reading = life.live.current()
        life.queue.seen(snapshot.gpus)
        recovery.recover(life)
        # Its threads start after every fork of the start (the notifier's): a lab with
        # no exporter still has a fatal fault drained (service.healthwatch).
        self.health = healthwatch.start(life.reading, life.settings.webhook)
        log.info("serving on %s", path)

    def close(self) -> None:
        """Stop serving. Jobs run on, attached ones too: their clients reconnect to the
        next service (service.attachment)."""
        self.stopping = True
        life = self.life
        if self.clients.listener is not None:
            with contextlib.suppress(OSError):
                os.unlink(life.settings.socket)
        self.clients.close()
        life.settle(stock=False)  # the last ends' notices go before the notifier stops
        life.close()
        life.hardware.close()
        if self.health is not None:
            self.health.stop()
        life.notifier.close()
        with contextlib.suppress(OSError, sqlite3.Error):  # else the next start's recovery
            life.remove_litter()
        life.store.close()
        for fd in self.locks:  # the lock files stay: removing a held one would race
            os.close(fd)
        self.locks.clear()
        if life.settings.devices != "off" and life.cgroup_mode != "none":
            from gpuwarden.service.jobcgroup import remove_scope, scope_of

            remove_scope(scope_of(life.exits))

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
                        time.sleep(min(1.0, self.life.settings.tick))
                    again = True
        finally:
            self.close()

    def step(self, timeout: Optional[float] = None) -> None:
        """One turn of the loop: plan if a pass is due (service.pacing: a start pass at
        once after anything that may start a job), do the tick's work once a tick has
        passed, wait for events (at most until the next pass or tick) and handle them,
        then plan what they let start before the turn's answers: a job's end or a
        submit that can start is planned for in the same turn, before the tick's work
        (the efficiency sampler's reading, time limits), and a submit's answer and its
        job's start share one fsync. What the ends left that no start waits for comes
        last (`JobLife.settle`). None of it grows with requests."""
        life, pacer = self.life, self.life.pacer
        pacer.turn += 1
        life.hardware.lease_dirs.turn()  # judged once a turn (leases.dir.Checked)
        if self.reload_asked:  # SIGHUP: a refused reading is logged and changes nothing
            self.reload_asked = False
            with contextlib.suppress(UserError):
                reloading.reload(life, self.started)
        self._plan()
        tick = life.settings.tick
        if time.monotonic() >= life.next_tick:  # after the pass: no start waits for it
            life.next_tick = time.monotonic() + tick
            self._tick()
        now = time.monotonic()
        longest = max(0.0, min(tick, life.next_tick - now))
        wait = pacer.wait(now, longest if timeout is None else timeout)
        if wait > 0 and pacer.urgent:
            pacer.deferred += 1  # a start waiting: none may (tests/test_service_counts.py)
        try:
            events = self.selector.select(wait)
            if wait > 0:  # what changed while it waited is seen
                life.hardware.lease_dirs.turn()
            for _ in range(GATHER):
                self._handle(events)
                # Answers wait for the journal's fsync: what came while they were made
                # shares it, unless a start is due (it waits for no one).
                if not self.clients.held or pacer.urgent:
                    break
                events = self.selector.select(0)
                if not events:
                    break
            if pacer.urgent:  # what the events let start, in this turn: the fsync that
                self._plan()  # makes its start durable makes the turn's submits durable
        finally:  # the turn's submits: one fsync, then their answers
            self.clients.release(life.store.sync)
        life.settle()  # what the turn's ends left that no start waited for

    def _plan(self) -> None:
        """A pass of the plan, if one is due (service.pacing). The ended jobs' files go
        at the tick, in a batch, when no job waits (service.litter)."""
        life = self.life
        kind = life.pacer.due(time.monotonic())
        if kind is not None:
            life.pacer.begin(kind)
            passes.schedule(life, full=kind == FULL)

    def _handle(self, events: list[tuple[selectors.SelectorKey, int]]) -> None:
        life = self.life
        for key, mask in events:
            kind, data = key.data
            if kind == "listen":
                self.clients.accept(life.settings)
            elif kind == "client":
                self.clients.ready(data, mask)
            elif kind == "job":
                life.ended(data)
            elif kind == "report":  # a supervisor's report: the job runs, or could not
                starting.arrived(life, data)

    # -- clients -----------------------------------------------------------------------

    def _answer(self, client: Connection, message: Mapping[str, Any]) -> dict[str, Any]:
        """A request answered, or refused in one line: a bug in one answer, or a journal
        that cannot be written, does not take the queue down with it."""
        try:
            return requests.handle(self.context, client.who, message, client)
        except UserError as err:
            return {"ok": False, "error": str(err)}
        except sqlite3.Error as err:
            log.error("request %r refused: %s", message.get("op"), err)
            return {"ok": False, "error": journal_failure(self.life.store.path, err)}
        except Exception as err:
            log.exception("request %r failed", message.get("op"))
            return {"ok": False, "error": f"internal error: {type(err).__name__}"}

    def _client_left(self, job_id: int) -> None:
        """An attached client went away: its job ends too, unless the service is
        stopping (jobs run on, for the next service)."""
        if not self.stopping:
            self.life.client_left(job_id)

    def _tick(self) -> None:
        life = self.life
        unwritten.retry(life)  # ends a full disk kept: written once it has room
        archive.tend(life, time.time())  # service.keep_history
        self.clients.idle(time.monotonic(), life.settings.idle_timeout)
        if self.clients.attachments.orphans:  # attached jobs a restart cut off
            recovery.end_orphans(life)
        timelimits.tick(life)
        starting.overdue(life, time.monotonic())
        kept = len(life.litter)  # ended jobs' files: in a batch, once the loop is quiet
        going = litter.due(kept, quiet=kept == self.litter_at_tick or not life.store.startable())
        if going:
            life.remove_litter(going)
        self.litter_at_tick = len(life.litter)
        if life.store.startable():  # a held job cannot start: none waits for a GPU
            life.pacer.touch()  # GPUs freed outside the queue show up on the next pass
