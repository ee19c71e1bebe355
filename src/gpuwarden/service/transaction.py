"""One commit of the journal for everything inside a `with`: SQLite's `BEGIN IMMEDIATE`
... `COMMIT`, or `ROLLBACK` when the block raises (service.store uses it for every
write; the service's requests group several writes in one).

A commit is durable (`synchronous=FULL`: the log fsynced when `COMMIT` returns) or not
(`NORMAL`: written, fsynced later by `Store.sync`). The connection is switched only
when a commit asks for the other kind than the last one did: the service's commits
are mostly of one kind, and switching it back and forth around each cost two
statements a commit."""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import Callable
from typing import Optional


class Transaction:
    """`BEGIN IMMEDIATE` ... `COMMIT` (or `ROLLBACK` on an exception); nests as a no-op.
    `mode` is the connection's `synchronous` setting as last set (a one-item list the
    journal keeps); `before_commit` runs inside the commit, last (the journal's rows
    kept to ride the next commit: Store.later)."""

    def __init__(
        self,
        db: sqlite3.Connection,
        durable: bool = True,
        on_rollback: Optional[Callable[[], None]] = None,
        on_commit: Optional[Callable[[bool], None]] = None,
        mode: Optional[list[bool]] = None,
        before_commit: Optional[Callable[[], None]] = None,
    ) -> None:
        self.db = db
        self.durable = durable
        self.outer = False
        self.on_rollback = on_rollback
        self.on_commit = on_commit
        self.mode = mode if mode is not None else [True]
        self.before_commit = before_commit

    def __enter__(self) -> None:
        self.outer = not self.db.in_transaction
        if self.outer:
            if self.mode[0] != self.durable:
                self.db.execute(f"PRAGMA synchronous={'FULL' if self.durable else 'NORMAL'}")
                self.mode[0] = self.durable
            self.db.execute("BEGIN IMMEDIATE")

    def __exit__(self, kind: object, *rest: object) -> None:
        if not self.outer:
            return
        try:
            if kind is None and self.before_commit is not None:
                try:
                    self.before_commit()
                except BaseException:
                    kind = True
                    raise
            if kind is not None and self.on_rollback is not None:
                self.on_rollback()  # what was kept in memory may not have happened
            if kind is None:
                self.db.execute("COMMIT")
            elif self.db.in_transaction:  # SQLite may have rolled it back (a full disk)
                self.db.execute("ROLLBACK")
            if kind is None and self.on_commit is not None:
                self.on_commit(self.durable)
        except BaseException:
            if self.db.in_transaction:  # a COMMIT that failed (a full disk) leaves it open
                with contextlib.suppress(sqlite3.Error):
                    self.db.execute("ROLLBACK")
            if self.on_rollback is not None:
                self.on_rollback()  # a failed commit: nothing of it happened either
            raise
