"""Fair share: how much each user and account used, against the share each was given.

The queue (gpuwarden.planning.scheduling) orders waiting jobs by Slurm's multifactor priority,
whose fair-share term comes from here. Usage is GPU-seconds decayed with a
half-life; a user's (or an account's) factor is Slurm's classic 2^(-U/S): U the
fraction of all usage that is theirs, S the fraction of all shares.

With account shares (`[service.accounts] vision = { members = [...], share = 3 }`)
fair share has two levels, as Slurm's account tree: a job's factor is its account's
factor among the accounts times its owner's factor among that account's users, each
counted from the usage charged to the account. When both accounts keep the queue
full, an account of share 3 and one of share 1 get the GPUs 3:1 however many users
each has. Jobs charged to no account form one more account (`-`) of the default
share. Pure: the service hands in the usage it keeps (service.accounting).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Optional, Protocol

#: The account of jobs charged to none, in the account level.
NO_ACCOUNT = "-"


class Shares(Protocol):
    """What fair share reads of the policy (scheduling.Policy)."""

    @property
    def shares(self) -> Mapping[str, float]: ...
    @property
    def default_share(self) -> float: ...
    @property
    def account_shares(self) -> Mapping[str, float]: ...
    @property
    def account_usage(self) -> Mapping[tuple[str, str], float]: ...


def decayed(usage: float, elapsed: float, half_life: float) -> float:
    """`usage` seen `elapsed` seconds ago, as it counts now."""
    if elapsed <= 0:
        return usage
    factor: float = 2.0 ** (-elapsed / half_life)  # float ** float is Any to a type checker
    return usage * factor


def job_usage(gpus: int, seconds: float, mem: Optional[int] = None, memory: int = 0) -> float:
    """GPU-seconds a job is charged: whole GPUs count 1 each; a shared job counts the
    fraction of the card it declared (a 20 GiB share of an 80 GiB card is 0.25)."""
    weight = 1.0 if mem is None or memory <= 0 else min(1.0, mem / memory)
    return gpus * weight * max(0.0, seconds)


def factors(
    usage: Mapping[str, float], shares: Mapping[str, float], default: float, names: Iterable[str]
) -> dict[str, float]:
    """2^(-U/S) for every name in `usage`, `shares` and `names`: 1.0 for one who used
    nothing, 0.5 for one who used exactly their share, towards 0 far over it."""
    everyone = set(usage) | set(shares) | set(names)
    total = sum(max(0.0, u) for u in usage.values())
    all_shares = sum(float(shares.get(n, default)) for n in everyone)
    out = {}
    for name in everyone:
        share = float(shares.get(name, default)) / all_shares if all_shares > 0 else 0.0
        used = max(0.0, usage.get(name, 0.0)) / total if total > 0 else 0.0
        if used == 0.0:
            out[name] = 1.0
        else:
            out[name] = 2.0 ** (-used / share) if share > 0 else 0.0
    return out


def fairshare_factors(
    usage: Mapping[str, float], policy: Shares, users: Iterable[str] = ()
) -> dict[str, float]:
    """Each user's factor (one level: users only), for every user in `usage`,
    `policy.shares` and `users`."""
    return factors(usage, policy.shares, policy.default_share, users)


def fairshare_factor(user: str, usage: Mapping[str, float], policy: Shares) -> float:
    """`fairshare_factors` for one user."""
    return fairshare_factors(usage, policy, (user,))[user]


def two_levels(policy: Shares) -> bool:
    """Whether accounts have shares: then fair share has the account level."""
    return bool(policy.account_shares)


def job_factors(
    jobs: Iterable[tuple[str, Optional[str]]], usage: Mapping[str, float], policy: Shares
) -> dict[tuple[str, Optional[str]], float]:
    """The factor of each (user, account) among `jobs`: the user's own one level, or
    with account shares, the account's factor times the user's within the account."""
    jobs = set(jobs)
    if not two_levels(policy):
        users = fairshare_factors(usage, policy, {u for u, _ in jobs})
        return {(u, a): users[u] for u, a in jobs}
    per_account: dict[str, dict[str, float]] = {}
    for (charged, owner), used in policy.account_usage.items():
        per_account.setdefault(charged or NO_ACCOUNT, {})[owner] = used
    seen: dict[str, set[str]] = {}
    for user, account in jobs:
        seen.setdefault(account or NO_ACCOUNT, set()).add(user)
    totals = {a: sum(users.values()) for a, users in per_account.items()}
    level = factors(totals, policy.account_shares, policy.default_share, seen)
    inside = {
        name: factors(per_account.get(name, {}), policy.shares, policy.default_share, users)
        for name, users in seen.items()
    }
    return {(u, a): level[a or NO_ACCOUNT] * inside[a or NO_ACCOUNT][u] for u, a in jobs}


def account_factors(policy: Shares, accounts: Iterable[str] = ()) -> dict[str, float]:
    """Each account's factor at the account level (`gpuwarden share`)."""
    totals: dict[str, float] = {}
    for (account, _), used in policy.account_usage.items():
        name = account or NO_ACCOUNT
        totals[name] = totals.get(name, 0.0) + used
    return factors(totals, policy.account_shares, policy.default_share, accounts)
