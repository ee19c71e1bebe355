"""Values fit for the page's document: bounded text, finite numbers, a user's blank row.

Lease records, wait-line tickets and the queue service's answers are written by
other users and other processes: every string is cut to a bounded length, every
number that JSON cannot carry (NaN, Infinity, a bool posing as one) becomes None.
Shared by the document (`web.model`) and its queue section (`web.queue`).
"""

from __future__ import annotations

import math
from typing import Any, Optional

TEXT_LIMIT = 200  # characters kept of any string another user controls


def text(value: object, limit: int = TEXT_LIMIT) -> str:
    """Any value as bounded text (lease metadata may hold any JSON type)."""
    out = value if isinstance(value, str) else ("" if value is None else str(value))
    return out if len(out) <= limit else out[: limit - 1] + "…"


def finite(value: object) -> Optional[float]:
    """A number fit for JSON, or None: lease and wait-line files are written by their
    holders, and Python's json reads NaN and Infinity, which JSON cannot carry."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None


def user_row(name: str) -> dict[str, Any]:
    """The users table's row for `name` before anything of theirs is counted."""
    return {
        "user": name,
        "leased_gpus": [],
        "used_gpus": [],
        "memory": 0,
        "processes": 0,
        "unreserved": 0,
    }
