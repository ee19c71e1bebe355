"""The journal's fsync off the service loop's thread.

The loop commits without waiting for the disk (`durable=False`) what it may promise only
once it is on disk: a submit's job id (service.clients), a start's STARTING record before
its go-ahead (service.placing). What waits for the disk asks `when_durable`: its callback
runs on the loop when a sync that began after its commit has completed. The fdatasync of
the write-ahead log runs on one thread of its own (it releases the interpreter's lock),
the loop goes on with other events meanwhile, and the thread says it is done through an
eventfd the loop's selector watches (`event`, handled by `finished`).

Commits are counted (a generation): a sync that began when `made` commits were made
makes those durable when it returns. One sync is in flight at a time; what waits for
later commits is batched into the next, begun as the one in flight completes. A sync
that fails promises nothing: its waiters are told so (`ok=False`: answers dropped, no
go-ahead). The log is opened on the loop's thread when a sync begins: SQLite may
checkpoint meanwhile (it fsyncs the log before it copies it, so what was in it is on disk
then) and write the log again from its start, but removes it only when the journal is
closed, which waits for the sync in flight (`settle`).
"""

from __future__ import annotations

import contextlib
import logging
import os
import queue
import select
import threading
from collections.abc import Callable
from typing import Optional

log = logging.getLogger("gpuwarden.serve")

#: Told whether the commits it waited for are on disk (False: a sync failed).
Waiter = Callable[[bool], None]


class Syncer:
    """The commits made, those known on disk, and the sync in flight for the rest."""

    def __init__(self, log_path: Optional[str]) -> None:
        self.log_path = log_path  # the write-ahead log; None: a journal in memory
        self.made = 0  # commits made
        self.durable = 0  # of those, how many are known on disk
        self.waiting: list[tuple[int, Waiter]] = []  # (commits it waits for, callback)
        self.target: Optional[int] = None  # what the sync in flight makes durable
        self.synced = 0  # fsyncs made on the thread
        self.on_loop = 0  # and on the caller's thread (`settle`: the service stops)
        self.failures = 0
        self.event = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        self._jobs: queue.SimpleQueue[Optional[int]] = queue.SimpleQueue()
        self._thread: Optional[threading.Thread] = None  # started at the first sync
        self._error: Optional[OSError] = None  # the sync in flight's failure

    @property
    def unsynced(self) -> bool:
        return self.durable < self.made

    def committed(self, durable: bool) -> None:
        """A commit was made; `durable`: SQLite fsynced the log with it (all before too)."""
        self.made += 1
        if durable:
            self.durable = self.made

    def when_durable(self, callback: Waiter) -> None:
        """Call `callback` on the loop once every commit made so far is on disk (at once
        when it is)."""
        if self.durable >= self.made:
            callback(True)
            return
        self.waiting.append((self.made, callback))
        self._begin()

    def _begin(self) -> None:
        """Begin a sync for what waits, unless one is in flight (it begins at its end)."""
        if self.target is not None or not self.waiting:
            return
        fd = self._open()
        if fd < 0:  # nothing to sync: no log, or checkpointed away (synced then)
            self.durable = self.made
            self._tell(self.made, True)
            return
        self.target = self.made
        if self._thread is None:
            self._thread = threading.Thread(target=self._work, name="journal-sync", daemon=True)
            self._thread.start()
        self._jobs.put(fd)

    def _open(self) -> int:
        if self.log_path is None:
            return -1
        try:
            return os.open(self.log_path, os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            return -1

    def _work(self) -> None:
        """The thread: one fdatasync of the log a job, then the loop told."""
        while True:
            fd = self._jobs.get()
            if fd is None:
                return
            try:
                os.fdatasync(fd)  # as SQLite syncs its log: the data and its size
            except OSError as err:
                self._error = err
            finally:
                os.close(fd)
                os.eventfd_write(self.event, 1)

    def finished(self) -> None:
        """The loop saw `event`: settle the sync that completed, begin the next."""
        try:
            os.eventfd_read(self.event)
        except BlockingIOError:
            return
        target, self.target = self.target, None
        if target is None:
            return
        error, self._error = self._error, None
        if error is None:
            self.synced += 1
            self.durable = max(self.durable, target)
            self._tell(self.durable, True)
        else:
            self.failures += 1
            log.error("the journal's log could not be synced: %s", error)
            self._tell(target, False)
        self._begin()

    def _tell(self, upto: int, ok: bool) -> None:
        told = [c for n, c in self.waiting if n <= upto]
        self.waiting = [(n, c) for n, c in self.waiting if n > upto]
        for callback in told:  # each told, whatever one of them raises
            try:
                callback(ok)
            except Exception:
                log.exception("what waited for the journal's sync failed")

    def settle(self) -> None:
        """Every commit made on disk now, on the caller's thread: the sync in flight
        waited for, the rest synced here, and every waiter told. Raises OSError when
        the sync fails (its waiters told so first)."""
        done = select.poll()
        done.register(self.event, select.POLLIN)
        while self.target is not None:  # and those `finished` begins for later waiters
            done.poll()
            self.finished()
        if not self.unsynced:
            return
        fd = self._open()
        if fd >= 0:
            try:
                os.fdatasync(fd)
                self.on_loop += 1
            except OSError:
                self.failures += 1
                self._tell(self.made, False)
                raise
            finally:
                os.close(fd)
        self.durable = self.made
        self._tell(self.made, True)

    def close(self) -> None:
        """Stop the thread (after `settle`) and close the eventfd."""
        if self._thread is not None:
            self._jobs.put(None)
            self._thread.join()
            self._thread = None
        with contextlib.suppress(OSError):
            os.close(self.event)
