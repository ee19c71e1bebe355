"""The page's usage panel: GPU-hours this month by user and by account, from the queue
service's `report` (as `gpuwarden report --per month`).

A month's report costs the service more than a queue listing, and changes slowly, so
the page's poller (web.queue) asks for it once every `EVERY` seconds, not on every
interval; `window` says which month, `panel` shapes the answers (pure). A missing,
refused or malformed answer leaves the panel out, never the queue.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any, Optional

from gpuwarden.web.values import finite, text

#: Seconds between two asks for the month's report.
EVERY = 60.0
#: Rows of each table at most, the most GPU-hours first.
ROWS = 50


def window(now: float) -> tuple[float, str]:
    """The start of `now`'s month (local time) and its label, `2026-12`."""
    start = datetime.fromtimestamp(now).replace(day=1, hour=0, minute=0, second=0, microsecond=0)
    return start.timestamp(), start.strftime("%Y-%m")


def panel(answers: Optional[Mapping[str, Any]]) -> Optional[dict[str, Any]]:
    """The document's `queue.usage` from the kept answers ({"month", "since", "user":
    reply, "account": reply}), or None when there is nothing to show."""
    if not isinstance(answers, Mapping):
        return None
    out: dict[str, Any] = {
        "month": text(str(answers.get("month", ""))),
        "users": [],
        "accounts": [],
    }
    for by, key in (("user", "users"), ("account", "accounts")):
        reply = answers.get(by)
        if not isinstance(reply, Mapping) or reply.get("ok") is not True:
            continue
        rows = reply.get("rows")
        for row in rows if isinstance(rows, list) else ():
            if not isinstance(row, Mapping) or not isinstance(row.get("name"), str):
                continue
            hours, jobs = finite(row.get("gpu_hours")), row.get("jobs")
            if hours is None or hours < 0 or not isinstance(jobs, int) or isinstance(jobs, bool):
                continue
            out[key].append({"name": text(row["name"]), "gpu_hours": hours, "jobs": jobs})
        out[key].sort(key=lambda r: (-r["gpu_hours"], r["name"]))
        del out[key][ROWS:]
    return out if out["users"] or out["accounts"] else None
