"""GPU-seconds used, decayed with a half-life: what the fair-share factor of a job's
priority weighs (gpuwarden.planning.scheduling). One row per user in the journal's table
`usage` (per account and user in `account_usage`, service.accounting), decayed when it
is read or charged, so it never needs a sweep."""

from __future__ import annotations

import sqlite3
from typing import Any, Optional

from gpuwarden.planning.scheduling import decayed


class Usage:
    """A usage table's rows, key -> (value, at), as last read or charged: every pass
    weighs them and every job's end charges one, and reading the table each time cost
    statements a job. The journal drops them when a commit fails (`forget`), to read
    them again. `columns`: the table's key columns (a key is a tuple of several)."""

    def __init__(self, table: str, columns: tuple[str, ...]) -> None:
        self.table, self.columns = table, columns
        self.rows: Optional[dict[Any, tuple[float, float]]] = None

    def _read(self, db: sqlite3.Connection) -> dict[Any, tuple[float, float]]:
        if self.rows is None:
            n = len(self.columns)
            query = f"SELECT {', '.join(self.columns)}, value, at FROM {self.table}"
            self.rows = {
                (str(r[0]) if n == 1 else tuple(str(k) for k in r[:n])): (
                    float(r[n]),
                    float(r[n + 1]),
                )
                for r in db.execute(query)
            }
        return self.rows

    def decayed(self, db: sqlite3.Connection, now: float, half_life: float) -> dict[Any, float]:
        """Each key's usage decayed to `now`."""
        rows = self._read(db)
        return {key: decayed(value, now - at, half_life) for key, (value, at) in rows.items()}

    def charge(
        self, db: sqlite3.Connection, key: Any, amount: float, now: float, half_life: float
    ) -> None:
        """Add GPU-seconds to `key`'s usage, decaying what was there to `now` first
        (inside the caller's transaction, which calls `forget` when it rolls back)."""
        rows = self._read(db)
        row = rows.get(key)
        value = 0.0 if row is None else decayed(row[0], now - row[1], half_life)
        value += max(0.0, amount)
        names = ", ".join(self.columns)
        keys = key if isinstance(key, tuple) else (key,)
        db.execute(
            f"INSERT INTO {self.table} ({names}, value, at) VALUES "
            f"({', '.join('?' for _ in keys)}, ?, ?) "
            f"ON CONFLICT({names}) DO UPDATE SET value = excluded.value, at = excluded.at",
            (*keys, value, now),
        )
        rows[key] = (value, now)

    def forget(self) -> None:
        self.rows = None
