"""Each user's GPU-seconds, decayed with a half-life: what the fair-share factor of a
job's priority weighs (gpuwarden.planning.scheduling). One row per user in the journal's table
`usage`, decayed when it is read or charged, so it never needs a sweep."""

from __future__ import annotations

import sqlite3

from gpuwarden.planning.scheduling import decayed


def usage(db: sqlite3.Connection, now: float, half_life: float) -> dict[str, float]:
    """Each user's usage decayed to `now`."""
    return {
        str(user): decayed(value, now - at, half_life)
        for user, value, at in db.execute("SELECT user, value, at FROM usage")
    }


def charge(db: sqlite3.Connection, user: str, amount: float, now: float, half_life: float) -> None:
    """Add GPU-seconds to `user`'s usage, decaying what was there to `now` first (inside
    the caller's transaction)."""
    row = db.execute("SELECT value, at FROM usage WHERE user = ?", (user,)).fetchone()
    old = 0.0 if row is None else decayed(row[0], now - row[1], half_life)
    db.execute(
        "INSERT INTO usage (user, value, at) VALUES (?, ?, ?) "
        "ON CONFLICT(user) DO UPDATE SET value = excluded.value, at = excluded.at",
        (user, old + max(0.0, amount), now),
    )
