"""Which boot of the machine the journal's jobs were started in.

A job's marker (service.marker) is named before the job execs but not waited onto
the disk: a crash of the service keeps it (the page cache outlives the process), and
only a crash of the machine can lose it, which ends the job too. So a marker's
absence says "never ran" only of a job started in this boot. The journal records
the boot its service runs in (`/proc/sys/kernel/random/boot_id`) before any job of
that boot starts (`record`, at the end of a restart's recovery); a restart that finds
another boot recorded (`earlier`) knows that every job it finds STARTING or RUNNING
started before the machine went down, and that its missing marker may be a lost
one: the job may have run, and is ended, never queued again.
"""

from __future__ import annotations

import logging
import sqlite3
from typing import Optional

from gpuwarden.service.store import Store

BOOT_ID = "/proc/sys/kernel/random/boot_id"
_KEY = "boot"


def current(path: str = BOOT_ID) -> str:
    """This boot's id; "" where the kernel does not say (then no boot is this one)."""
    try:
        with open(path, encoding="ascii") as fh:
            return fh.read().strip()
    except (OSError, ValueError):
        return ""


def recorded(store: Store) -> Optional[str]:
    """The boot the journal's service last recorded; None in a journal written before
    boots were recorded, whose every marker was waited onto the disk before its job
    ran (its absence is sure)."""
    row = store.db.execute("SELECT value FROM meta WHERE key = ?", (_KEY,)).fetchone()
    return None if row is None else str(row[0])


def earlier(store: Store, now: str) -> bool:
    """Whether the journal's running and starting jobs may have started in an earlier
    boot than `now` (an unknown boot is never this one)."""
    seen = recorded(store)
    return seen is not None and (not now or seen != now)


def record(store: Store, now: str) -> None:
    """Record `now` as the journal's boot, on disk (with every change before it), where
    it is not already. Not recorded (a full disk): the next restart takes the jobs of
    this boot for an earlier one's, and ends a job whose marker is missing instead of
    queueing it again: never a job run twice."""
    if recorded(store) == now:
        return
    try:
        with store.transaction():
            store.db.execute(
                "INSERT INTO meta (key, value) VALUES (?, ?) ON CONFLICT(key) "
                "DO UPDATE SET value = excluded.value",
                (_KEY, now),
            )
    except sqlite3.Error as err:
        logging.getLogger("gpuwarden.serve").warning("could not record this boot: %s", err)
