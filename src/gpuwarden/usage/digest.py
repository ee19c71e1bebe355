"""The week's digest of GPU use, told kindly: one for each user who asks for it, one
for the admins (`gpuwarden digest`, sent by the service every `service.digest_every`).

Sites send users their low-efficiency jobs (Princeton's job_defense_shield, mila's
GPU-waste guide); a note that says what was held and what sat idle, with the command
that shows why, does more than a quota. Pure: the report's rows in
(gpuwarden.usage.report: `Row` for GPU-hours and waits, `Waste` for idle GPU-hours), one
JSON-ready dict out, whose `text` is the mail.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any, Optional

from gpuwarden.usage.report import Row, Waste

#: A job is named in a digest when at least this share of what it held sat idle.
IDLE_SHARE = 0.5
#: ... and at most this many of them, the idlest first.
MOST_JOBS = 5
#: The users an admin's digest lists by name, the most GPU-hours first.
MOST_USERS = 20


def _day(moment: float) -> str:
    return datetime.fromtimestamp(moment).strftime("%Y-%m-%d")


def _hours(value: float) -> str:
    return f"{value:.1f}" if value >= 1 else f"{value:.2f}"


def for_user(
    user: str, used: Optional[Row], jobs: Sequence[Waste], since: float, until: float
) -> dict[str, Any]:
    """`user`'s digest for [since, until): their report row (None: no GPU use) and the
    waste of each of their sampled jobs (`Waste` by job)."""
    held = sum(w.held_hours for w in jobs)
    idle = sum(w.idle_hours for w in jobs)
    named = [w for w in jobs if w.held_hours > 0 and w.idle_hours >= IDLE_SHARE * w.held_hours]
    named.sort(key=lambda w: (-w.idle_hours, w.name))
    digest: dict[str, Any] = {
        "event": "DIGEST",
        "kind": "user",
        "user": user,
        "since": since,
        "until": until,
        "gpu_hours": used.gpu_hours if used else 0.0,
        "jobs": used.jobs if used else 0,
        "runs": used.runs if used else 0,
        "mean_wait": used.mean_wait if used else None,
        "idle_hours": idle,
        "busy_share": None if held <= 0 else max(0.0, 1.0 - idle / held),
        "idle_jobs": [
            {
                "job": w.name,
                "held_hours": w.held_hours,
                "idle_hours": w.idle_hours,
                "gpus_idle": w.gpus_idle,
            }
            for w in named[:MOST_JOBS]
        ],
    }
    digest["text"] = _user_text(digest)
    return digest


def _user_text(d: dict[str, Any]) -> str:
    lines = [f"Your GPU use from {_day(d['since'])} to {_day(d['until'])}:", ""]
    if not d["jobs"] and d["gpu_hours"] <= 0:
        return "\n".join([*lines, "No GPU jobs this time: nothing to report."]) + "\n"
    wait = d["mean_wait"]
    lines.append(
        f"{_hours(d['gpu_hours'])} GPU-hours in {d['jobs']} jobs"
        + (f", waiting {wait / 60:.0f} min on average to start" if wait is not None else "")
        + "."
    )
    if d["busy_share"] is not None:
        lines.append(
            f"The GPUs were busy {100 * d['busy_share']:.0f}% of the time they were sampled"
            f" ({_hours(d['idle_hours'])} GPU-hours held idle)."
        )
    if d["idle_jobs"]:
        lines += ["", "These jobs left most of what they held idle; others were waiting:"]
        for job in d["idle_jobs"]:
            never = f", {job['gpus_idle']} GPU(s) never used" if job["gpus_idle"] else ""
            lines.append(
                f"  job {job['job']}: {_hours(job['idle_hours'])} of "
                f"{_hours(job['held_hours'])} GPU-hours idle{never}"
            )
        first = d["idle_jobs"][0]["job"]
        lines += [
            "",
            f"`gpuwarden eff {first}` shows each GPU's use. Asking for fewer GPUs, or",
            "releasing them while a job prepares data, lets the next job start sooner.",
        ]
    else:
        lines += ["", "Nothing held idle for long: thank you."]
    return "\n".join(lines) + "\n"


def for_admins(
    users: Sequence[Row], waste: Sequence[Waste], since: float, until: float
) -> dict[str, Any]:
    """The admins' digest for [since, until): the report by user and the waste by user."""
    idle = {w.name: w for w in waste}
    ranked = sorted(users, key=lambda r: (-r.gpu_hours, r.name))
    digest: dict[str, Any] = {
        "event": "DIGEST",
        "kind": "admin",
        "since": since,
        "until": until,
        "gpu_hours": sum(r.gpu_hours for r in users),
        "jobs": sum(r.jobs for r in users),
        "idle_hours": sum(w.idle_hours for w in waste),
        "users": [
            {
                "user": r.name,
                "gpu_hours": r.gpu_hours,
                "jobs": r.jobs,
                "idle_hours": idle[r.name].idle_hours if r.name in idle else 0.0,
            }
            for r in ranked[:MOST_USERS]
        ],
    }
    lines = [
        f"GPU use on this machine from {_day(since)} to {_day(until)}:",
        "",
        f"{_hours(digest['gpu_hours'])} GPU-hours in {digest['jobs']} jobs, "
        f"{_hours(digest['idle_hours'])} of them held idle.",
        "",
        f"{'user':<16} {'GPU-hours':>10} {'jobs':>6} {'idle':>8}",
    ]
    for u in digest["users"]:
        lines.append(
            f"{u['user']:<16} {_hours(u['gpu_hours']):>10} {u['jobs']:>6} "
            f"{_hours(u['idle_hours']):>8}"
        )
    lines += ["", "`gpuwarden report --waste --by job` lists the jobs behind the idle hours."]
    digest["text"] = "\n".join(lines) + "\n"
    return digest
