"""The service's side of `[service.limits]` (service.limits has the rules): the
limits in force for whoever asks, a submit over one refused naming the rule, the
plan's per-user GPU caps, and `gpuwarden limits`. Admins are bound by none. Functions
of what they read, the settings in force and the journal, handed in by the caller.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, Optional

from gpuwarden.base.errors import UserError
from gpuwarden.planning import scheduling
from gpuwarden.queueclient import protocol
from gpuwarden.service import accounting, journalbytes
from gpuwarden.service.identity import Person, person
from gpuwarden.service.limits import Limit, refusal
from gpuwarden.service.store import Job, Store

if TYPE_CHECKING:
    from gpuwarden.service.settings import Settings

WEEK = 7 * 86400.0


def limits_of(settings: Settings, who: Person) -> dict[str, Limit]:
    """The limits in force for `who` ({} for an admin: none binds them)."""
    s = settings
    if s.admins.include(who):
        return {}
    machine = {
        "max_gpus_per_user": s.policy.max_gpus_per_user,
        "max_jobs_per_user": s.max_jobs_per_user,
        "max_time": s.max_time,
        "max_interactive_time": s.max_interactive_time,
    }
    return s.limits.of(who.name, who.groups, machine)


def within_limits(
    settings: Settings, journal: Store, who: Person, sub: protocol.Submit, tasks: int, array: bool
) -> None:
    """Refuse, in one line naming the rule, a job over one of `who`'s limits."""
    if not settings.admins.include(who):  # set or not, a bound (journalbytes)
        adding = journalbytes.adds(sub, tasks)
        journalbytes.check(journal.db, who.uid, adding, settings.max_journal_bytes)
    limits = limits_of(settings, who)
    if not limits:
        return
    hours, active = None, 0
    if sub.preemptible:
        # Beyond the GPU limit and the week's budget (it yields to whoever needs the
        # GPUs); its jobs counted apart from the owner's others, against the same bound.
        mine = (j for j in journal.jobs() if j.uid == who.uid and j.preemptible)
        active = sum(1 for _ in mine) if "max_jobs" in limits else 0
    else:
        if "gpu_hours_per_week" in limits:
            hours = _week_hours(journal, who.name)
        if "max_jobs" in limits:
            active = journal.count_active(who.uid)
    why = refusal(
        limits,
        gpus=0 if sub.preemptible else sub.gpus.gpu_count,
        time_limit=sub.time_limit,
        tasks=tasks,
        array=array,
        active=active,
        gpu_hours=hours,
        interactive=sub.attached,
    )
    if why is not None:
        raise UserError(why)


def charged(
    settings: Settings, journal: Store, who: Person, sub: protocol.Submit, tasks: int
) -> Optional[str]:
    """The account a submit is charged to (service.accounts), refused in one line
    when `who` may not charge it or it is over one of its limits."""
    from gpuwarden.service import accounting

    s = settings
    admin = s.admins.include(who)
    account = s.accounts.choose(who.name, who.groups, sub.account, admin)
    if account is None or admin:
        return account
    entry = s.accounts.entries[account]
    db = journal.db
    now = time.time()
    why = s.accounts.refusal(
        account,
        time_limit=sub.time_limit,
        tasks=tasks,
        gpus=0 if sub.preemptible else sub.gpus.gpu_count,
        active=accounting.account_active(db, account) if "max_jobs" in entry else 0,
        gpu_hours=accounting.account_gpu_seconds(db, account, now - WEEK, now) / 3600
        if "gpu_hours_per_week" in entry
        else None,
    )
    if why is not None:
        raise UserError(why)
    return account


def interactive_time(settings: Settings, who: Person, sub: protocol.Submit) -> Optional[float]:
    """The time an interactive hold (an attached job: a kernel, `gpuwarden.lease()`,
    `run`) that asks for none is given: `service.interactive_time`, cut to the
    longest one `who` may hold. None: it keeps none (then `max_time` may refuse it)."""
    default = settings.interactive_time
    if not sub.attached or sub.time_limit is not None or default is None:
        return sub.time_limit
    limits = limits_of(settings, who)
    longest = limits.get("max_interactive_time") or limits.get("max_time")
    return default if longest is None else min(default, longest.value)


def plan_policy(settings: Settings, journal: Store, jobs: Iterable[Job]) -> scheduling.Policy:
    """The policy a pass of the plan uses for `jobs`' owners: admins exempt from the
    GPU limits, each owner's own cap where `[service.limits]` gives one, and with
    account shares, the usage charged to each account."""
    policy = settings.policy
    if policy.account_shares:  # fair share's account level (gpuwarden.planning.fairshare)
        usage = journal.account_usage(time.time(), policy.half_life)
        policy = dataclasses.replace(policy, account_usage=usage)
    entries = bool(settings.limits.entries)
    if policy.max_gpus_per_user is None and not entries and not policy.account_caps:
        return policy
    owners = {j.uid: j.user for j in jobs}
    exempt, caps = set(policy.exempt), {}
    for uid, name in owners.items():
        try:
            who = person(uid)
        except UserError:
            continue
        if settings.admins.include(who):
            exempt.add(name)
        elif entries and "max_gpus" in (mine := limits_of(settings, who)):
            caps[name] = int(mine["max_gpus"].value)
    return dataclasses.replace(policy, exempt=frozenset(exempt), gpu_caps=caps)


def _week_hours(journal: Store, user: str) -> float:
    """GPU-hours `user`'s jobs held in the last week (service.accounting)."""
    return accounting.gpu_seconds_since(journal.db, user, time.time() - WEEK) / 3600


def limits_answer(settings: Settings, journal: Store, who: Person) -> dict[str, Any]:
    """`gpuwarden limits`: the asker's limits, each with its rule and what they use."""
    limits = limits_of(settings, who)
    jobs = [j for j in journal.jobs() if j.uid == who.uid and j.user == who.name]
    used = {
        "max_gpus": float(sum(len(j.gpus) for j in jobs if j.gpus)),
        "max_jobs": float(len(jobs)),
        "gpu_hours_per_week": _week_hours(journal, who.name),
    }
    return {
        "ok": True,
        "user": who.name,
        "admin": settings.admins.include(who),
        "limits": [
            {"limit": kind, "value": limit.value, "rule": limit.rule, "used": used.get(kind)}
            for kind, limit in limits.items()
        ],
    }
