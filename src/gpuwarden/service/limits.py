"""Per-user and per-group limits of the queue service: `[service.limits]`.

As Slurm's association limits (and gflow's quotas), a lab gives its students less
than its postdocs:

    [service.limits]
    "@students" = { max_gpus = 2, max_jobs = 20, max_time = "1d", gpu_hours_per_week = 100 }
    "@postdocs" = { max_gpus = 4, max_interactive_time = "12h" }
    alice = { max_gpus = 8 }

`max_interactive_time` bounds the interactive holds (kernels, `gpuwarden.lease()`,
an attached `run`) in place of `max_time`, which bounds them where it is not set.
A user's own entry decides each limit it names; else, among the user's groups that
name it, the most generous; else the machine-wide `max_gpus_per_user`,
`max_jobs_per_user`, `max_time` and `max_interactive_time`. Each limit comes with
the rule that set it, so a refusal names the rule (`service.limits @students
max_gpus`). Admins are bound by none. Pure: the service supplies who asks and what they use.
"""

from __future__ import annotations

import grp
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple, Optional

from gpuwarden.base.errors import UserError

KINDS = ("max_gpus", "max_jobs", "max_time", "max_interactive_time", "gpu_hours_per_week")
#: The machine-wide key each limit falls back to (the GPU-hour budget has none).
MACHINE_WIDE = {
    "max_gpus": "max_gpus_per_user",
    "max_jobs": "max_jobs_per_user",
    "max_time": "max_time",
    "max_interactive_time": "max_interactive_time",
}


class Limit(NamedTuple):
    """One limit in force for a user: its value and the rule that set it."""

    value: float
    rule: str


@dataclass(frozen=True)
class Limits:
    """The `[service.limits]` table: entry name (`alice`, `@students`) -> its limits;
    groups by gid, resolved when read."""

    entries: Mapping[str, Mapping[str, float]] = field(default_factory=dict)
    gids: Mapping[str, int] = field(default_factory=dict)  # "@name" -> gid

    @classmethod
    def parse(cls, table: Mapping[str, Mapping[str, float]]) -> Limits:
        """The validated table (`config.values` checked its shape); an unknown group is
        refused in one line naming it."""
        gids = {}
        for name in table:
            if name.startswith("@"):
                try:
                    gids[name] = grp.getgrnam(name[1:]).gr_gid
                except KeyError:
                    raise UserError(f"service.limits: no group named {name[1:]!r}") from None
        return cls({k: dict(v) for k, v in table.items()}, gids)

    def describe(self) -> str:
        if not self.entries:
            return "none"
        from gpuwarden.base.units import format_span

        def shown(kind: str, value: float) -> str:
            return format_span(value) if kind.endswith("_time") else f"{value:g}"

        return "; ".join(
            f"{name} " + ", ".join(f"{k}={shown(k, v)}" for k, v in sorted(limits.items()))
            for name, limits in sorted(self.entries.items())
        )

    def of(
        self, user: str, groups: tuple[int, ...], machine: Mapping[str, Any]
    ) -> dict[str, Limit]:
        """The limits in force for `user` (a member of `groups`), over `machine`'s
        machine-wide values (`max_gpus_per_user`...); a limit that none sets is absent."""
        out: dict[str, Limit] = {}
        mine = self.entries.get(user, {})
        for kind in KINDS:
            if kind in mine:
                out[kind] = Limit(mine[kind], f"service.limits {user} {kind}")
                continue
            best: Optional[Limit] = None
            for name, limits in self.entries.items():
                ours = kind in limits and self.gids.get(name, -1) in groups
                if ours and (best is None or limits[kind] > best.value):
                    best = Limit(limits[kind], f"service.limits {name} {kind}")
            if best is None and machine.get(MACHINE_WIDE.get(kind, "")) is not None:
                best = Limit(machine[MACHINE_WIDE[kind]], MACHINE_WIDE[kind])
            if best is not None:
                out[kind] = best
        return out


def refusal(
    limits: Mapping[str, Limit],
    *,
    gpus: int,
    time_limit: Optional[float],
    tasks: int = 1,
    array: bool = False,
    active: int = 0,
    gpu_hours: Optional[float] = None,
    interactive: bool = False,
) -> Optional[str]:
    """Why a job (`tasks` of them for an array) of a user with `limits`, who has `active`
    jobs queued or running and used `gpu_hours` in the last 7 days, is refused at
    submit; None when it is not. Each reason names the rule. An `interactive` job (an
    attached one) is bound by `max_interactive_time` where one is in force."""
    from gpuwarden.base.units import format_span

    jobs = limits.get("max_jobs")
    if jobs is not None and active + tasks > jobs.value:
        if array:  # each task is a job
            return (
                f"this array has {tasks} tasks; with the {active} jobs you have queued or "
                f"running that is over the {jobs.value:g} allowed ({jobs.rule})"
            )
        if active > jobs.value:  # the limit was lowered by a reload since
            return (
                f"you have {active} jobs queued or running, over the {jobs.value:g} allowed "
                f"({jobs.rule})"
            )
        return f"you have {active} jobs queued or running, the most allowed ({jobs.rule})"
    most = limits.get("max_gpus")
    if most is not None and gpus > most.value:
        # It could only wait for ever, the limit's reason beside it: say so now.
        return (
            f"{gpus} GPUs is more than the {most.value:g} a user may use at once "
            f"on this machine ({most.rule})"
        )
    longest = limits.get("max_time")
    if interactive and "max_interactive_time" in limits:
        longest = limits["max_interactive_time"]
    if longest is not None:
        span = format_span(longest.value)
        if time_limit is None:
            return f"this machine needs --time on every job, at most {span} ({longest.rule})"
        if time_limit > longest.value:
            return (
                f"--time {format_span(time_limit)} is over this machine's limit of {span} "
                f"({longest.rule})"
            )
    budget = limits.get("gpu_hours_per_week")
    if budget is not None and gpu_hours is not None and gpu_hours >= budget.value:
        return (
            f"you used {_hours(gpu_hours)} of your {budget.value:g} GPU-hours of the last 7 "
            f"days ({budget.rule}); jobs are taken again as the week rolls on"
        )
    return None


def _hours(value: float) -> str:
    """GPU-hours with as many decimals as a small budget needs (`0.012`, `1.5`, `37`):
    never "used 0.0 of your 0.01"."""
    if value == 0:
        return "0"
    for places in (0, 1, 2, 3):
        if value >= 10 ** (1 - places) or places == 3:
            return f"{value:.{places}f}"
    return f"{value:g}"
