"""Accounts (Slurm's word): whose GPU-hours a job's are, `[service.accounts]`.

A PI asks how much each project used; a job names its project with `--account`
(`submit`, `run`, arrays, `kernel install`, `gpuwarden.lease(account=...)`, or the
user's `submit.account`), and `gpuwarden report --by account` sums them:

    [service]
    require_account = true            # a job that names none is refused
    [service.accounts]
    vision = { members = ["alice", "@vision"], share = 3, max_gpus = 6 }
    nlp = { members = ["@nlp"], max_jobs = 50, max_time = "2d" }

A user may charge only an account whose members name them or one of their groups
(as the kernel says who asks: SO_PEERCRED, never $USER); an admin any account. A
user of exactly one account who names none is charged to it. An account's limits
bind all its jobs together, as Slurm's GrpTRES, GrpJobs and GrpTRESMins: the GPUs
its running jobs hold (`max_gpus`: the queue keeps the others waiting, reason
AccountGpuLimit), its jobs queued or running (`max_jobs`), each job's `--time`
(`max_time`), and the GPU-hours its jobs held over the last 7 days
(`gpu_hours_per_week`). Its `share` weighs it in fair share (gpuwarden.planning.fairshare).
Pure: the service supplies who asks and what the account uses.
"""

from __future__ import annotations

import grp
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Optional

from gpuwarden.base.errors import UserError


@dataclass(frozen=True)
class Accounts:
    """The `[service.accounts]` table, groups resolved to gids when read."""

    entries: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    gids: Mapping[str, int] = field(default_factory=dict)  # "@name" -> gid
    require: bool = False  # service.require_account

    @classmethod
    def parse(cls, table: Mapping[str, Mapping[str, Any]], require: bool = False) -> Accounts:
        """The validated table (config.values checked its shape); an unknown group is
        refused in one line naming it and its account."""
        gids = {}
        for name, entry in table.items():
            for member in entry["members"]:
                if member.startswith("@") and member not in gids:
                    try:
                        gids[member] = grp.getgrnam(member[1:]).gr_gid
                    except KeyError:
                        raise UserError(
                            f"service.accounts {name}: no group named {member[1:]!r}"
                        ) from None
        return cls({k: dict(v) for k, v in table.items()}, gids, require)

    def describe(self) -> str:
        if not self.entries:
            return "none" + (" (required)" if self.require else "")
        return "; ".join(
            f"{name} " + ", ".join(str(m) for m in entry["members"])
            for name, entry in sorted(self.entries.items())
        ) + (" (required)" if self.require else "")

    def of(self, name: str, groups: tuple[int, ...]) -> list[str]:
        """The accounts the user `name`, a member of `groups`, may charge."""
        return sorted(
            account
            for account, entry in self.entries.items()
            if any(
                m == name or (m.startswith("@") and self.gids.get(m, -1) in groups)
                for m in entry["members"]
            )
        )

    def choose(
        self, name: str, groups: tuple[int, ...], asked: Optional[str], admin: bool = False
    ) -> Optional[str]:
        """The account a job of `name`'s is charged to: the one asked for, which must be
        theirs (any, for an admin); else their only one; else none, unless the machine
        requires one. Each refusal is one line naming the rule."""
        mine = self.of(name, groups)
        if asked is not None:
            if asked not in self.entries:
                known = ", ".join(mine) or "none"
                raise UserError(f"--account {asked}: no such account here (yours: {known})")
            if asked not in mine and not admin:
                raise UserError(
                    f"--account {asked}: you are not one of its members "
                    f"(service.accounts {asked} members)"
                )
            return asked
        if len(mine) == 1:
            return mine[0]
        if self.require:
            choices = (
                f"one of yours: {', '.join(mine)}" if mine else "you are in none: ask an admin"
            )
            raise UserError(
                f"this machine charges every job to an account (service.require_account): "
                f"add --account NAME ({choices})"
            )
        return None

    def refusal(
        self,
        account: str,
        *,
        time_limit: Optional[float],
        tasks: int = 1,
        active: int = 0,
        gpu_hours: Optional[float] = None,
        gpus: int = 0,
    ) -> Optional[str]:
        """Why `tasks` more jobs of `gpus` GPUs each charged to `account` (which has
        `active` jobs queued or running and held `gpu_hours` in the last 7 days) are
        refused; None when not."""
        from gpuwarden.base.units import format_span

        entry = self.entries.get(account, {})
        rule = f"service.accounts {account}"
        widest = entry.get("max_gpus")
        if widest is not None and gpus > widest:
            # It could only wait for ever, the limit's reason beside it: say so now.
            return (
                f"{gpus} GPUs is more than the {widest:g} account {account}'s jobs may use "
                f"at once ({rule} max_gpus)"
            )
        most = entry.get("max_jobs")
        if most is not None and active + tasks > most:
            return (
                f"account {account} has {active} jobs queued or running; {tasks} more is over "
                f"the {most:g} allowed ({rule} max_jobs)"
            )
        longest = entry.get("max_time")
        if longest is not None:
            if time_limit is None:
                return (
                    f"account {account} needs --time on every job, at most "
                    f"{format_span(longest)} ({rule} max_time)"
                )
            if time_limit > longest:
                return (
                    f"--time {format_span(time_limit)} is over account {account}'s limit of "
                    f"{format_span(longest)} ({rule} max_time)"
                )
        budget = entry.get("gpu_hours_per_week")
        if budget is not None and gpu_hours is not None and gpu_hours >= budget:
            return (
                f"account {account} used {gpu_hours:.1f} of its {budget:g} GPU-hours of the last "
                f"7 days ({rule} gpu_hours_per_week); jobs are taken again as the week rolls on"
            )
        return None
