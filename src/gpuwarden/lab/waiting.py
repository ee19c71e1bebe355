"""Why a waiting job waits, in words: the service's reason (squeue's vocabulary,
`gpuwarden.planning.scheduling`), what that reason means, what the job waits for, its place
in line and its estimated start. Pure: it reads the queue's rows and nothing else,
so the assistants' answer and the terminal view's say the same."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any, Optional

from gpuwarden.planning import scheduling as s

#: What each reason means, for someone who has never read squeue's manual.
MEANINGS: dict[str, str] = {
    s.RESOURCES: "not enough free GPUs for it now",
    s.PRIORITY: "it would fit, but starting it now could delay a job ahead of it in line",
    s.HELD: "it is held: it starts only once its owner or an admin releases it (unhold)",
    s.DEPENDENCY: "it waits for the jobs it was submitted --after to end",
    s.DEPENDENCY_FAILED: "a job it was submitted --after failed or was cancelled: it never "
    "starts; cancel it",
    s.USER_GPU_LIMIT: "its owner already uses as many GPUs as the service allows "
    "(`gpuwarden limits` says which rule)",
    s.DRAINED: "every GPU it could use is drained or unhealthy",
    s.BEGIN_TIME: "its --begin time has not come",
    s.BOOKED: "the GPUs it could get now are booked for someone else",
}


def waiting_order(jobs: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """The waiting jobs in the order they start: priority, then submission."""
    return sorted(
        (j for j in jobs if j.get("state") == "PENDING"),
        key=lambda j: (-float(j.get("priority") or 0.0), float(j.get("submitted") or 0.0)),
    )


def wants(job: Mapping[str, Any]) -> str:
    """`2 GPUs`, `1 GPU (shared, 10.0 GiB)`, what the job asked for."""
    from gpuwarden.base.units import format_size

    count = job.get("count") or 0
    words = f"{count} GPU{'' if count == 1 else 's'}"
    mem = job.get("mem")
    if isinstance(mem, int):
        words += f" (shared, {format_size(mem)})"
    return words


def explain(
    job: Mapping[str, Any], jobs: Sequence[Mapping[str, Any]], now: Optional[float] = None
) -> dict[str, Any]:
    """Why `job` (one of `jobs`, the queue's rows) waits, or what it is doing if it
    does not. Keys: job, state, reason, meaning, waits_for (a list of phrases),
    place (1 = next to start) and ahead, estimated_start (epoch seconds or None) and
    starts_in (words), summary (one sentence)."""
    now = time.time() if now is None else now
    label = str(job.get("label") or job.get("id"))
    state = str(job.get("state"))
    out: dict[str, Any] = {"job": label, "state": state, "user": job.get("user")}
    if state != "PENDING":
        out["summary"] = f"job {label} is {state.lower()}, not waiting"
        return out
    reason = str(job.get("reason") or "")
    line = waiting_order(jobs)
    place = next((i for i, j in enumerate(line) if j.get("id") == job.get("id")), None)
    waits_for = [wants(job)]
    after = [a for a in job.get("after") or () if isinstance(a, (int, str))]
    if after:
        waits_for.append(
            "the end of job" + ("s " if len(after) > 1 else " ") + ", ".join(str(a) for a in after)
        )
    if job.get("held"):
        waits_for.append("a release (`gpuwarden unhold`)")
    start = job.get("estimated_start")
    start = float(start) if isinstance(start, (int, float)) else None
    meaning = MEANINGS.get(reason, "the service gave no further word")
    out.update(
        reason=reason or None,
        meaning=meaning,
        waits_for=waits_for,
        place=None if place is None else place + 1,
        ahead=place,
        estimated_start=start,
        starts_in=starts_in(start, now),
    )
    summary = f"job {label} waits ({reason or 'no reason given'}): {meaning}"
    if place is not None:
        summary += f"; {place} job{'' if place == 1 else 's'} ahead of it"
    summary += f"; {starts_in(start, now)}"
    out["summary"] = summary
    return out


def starts_in(start: Optional[float], now: float) -> str:
    """`expected to start in about 12m03s (at 14:05)`, or why nobody can say."""
    if start is None:
        return "no start can be estimated (a job without --time, a hold, a dependency or a limit)"
    from gpuwarden.base.units import format_span

    at = time.strftime("%H:%M", time.localtime(start))
    return f"expected to start in about {format_span(max(0.0, start - now))} (at {at})"
