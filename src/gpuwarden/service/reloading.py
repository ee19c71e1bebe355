"""Live policy: `gpuwarden service reload` (admins) and SIGHUP read the configuration
again, as `scontrol reconfigure` does, without a restart (which would cut every
attached client off for a moment). A configuration file that is not trusted (writable
by others, not root's: config.trust) is refused as a whole, at start and at reload
alike: read without it, every limit would silently fall back to its default.

The `[service]` and `[enforce]` tables are read afresh, with the command line's
values of `gpuwarden serve` still over them. A reading that is refused (a file that
does not parse, a bad value, an unknown group) changes nothing: the error names the
key and the policy in force stays. What a running service cannot change (its socket,
journal, lease directory, and the helper that sends webhooks and mail, forked at
start) is kept, and the log says it changes at the next restart. The log says every
change (`reload: max_gpus_per_user: 2 -> 4`); the next pass of the plan uses them.
Of the jobs' life, what `Reloadable` names; its enforcement watch takes the new rules.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from gpuwarden.base.errors import UserError

if TYPE_CHECKING:
    from typing import Protocol

    from gpuwarden.service.identity import Person
    from gpuwarden.service.machine import Machine
    from gpuwarden.service.pacing import Pacer
    from gpuwarden.service.settings import Settings
    from gpuwarden.service.watching import ServiceWatch

    class Reloadable(Protocol):
        """What a reload needs of the jobs' life (`joblife.JobLife` has it)."""

        settings: Settings  # replaced by a reload
        pacer: Pacer
        hardware: Machine

        def watcher(self) -> ServiceWatch: ...


log = logging.getLogger("gpuwarden.serve")


@dataclass(frozen=True)
class Started:
    """What `gpuwarden serve` was started with, kept for every reload: its options
    over the files (config keys), its socket and state directory, the admins it named."""

    options: Mapping[str, Any]
    fixed: Mapping[str, Any]
    admins: tuple[str, ...]


def read_settings(
    options: Mapping[str, Any], fixed: Mapping[str, Any], admins: tuple[str, ...]
) -> Settings:
    """The settings the configuration gives now, with `gpuwarden serve`'s options over
    it (UserError naming a bad key)."""
    from gpuwarden import config
    from gpuwarden.service.settings import from_config

    reading = config.load(cli=dict(options))
    for _, path, why in reading.refused:  # its limits would silently be the defaults
        raise UserError(f"the configuration {path} is not trusted: {why}")
    return from_config(reading, fixed, admins)


def reload_by(service: Reloadable, started: Started, who: Person) -> dict[str, Any]:
    """The `reload` request: an admin's only."""
    if not service.settings.admins.include(who):
        raise UserError("only an admin may reload the service's policy")
    return {"ok": True, "changes": reload(service, started)}


def reload(service: Reloadable, started: Started) -> list[str]:
    """Read the configuration again and put it in force; what changed, one line each.
    Raises UserError ("refused: ...; the policy in force stays") and changes nothing
    when the reading is refused."""
    from gpuwarden.service.settings import RESTART_ONLY, changes

    try:
        new = read_settings(started.options, started.fixed, started.admins)
    except UserError as err:
        log.error("reload refused: %s; the policy in force stays", err)
        raise UserError(f"reload refused: {err}; the policy in force stays") from None
    later = [n for n in RESTART_ONLY if getattr(new, n) != getattr(service.settings, n)]
    new = dataclasses.replace(new, **{n: getattr(service.settings, n) for n in later})
    changed = changes(service.settings, new)
    service.settings = new
    service.watcher().enforcer.rules = new.enforce  # its state between readings stays
    service.pacer.wake()  # new limits and weights may start a job
    service.pacer.touch()  # and change every waiting job's priority
    service.hardware.forget_links()
    for line in changed:
        log.info("reload: %s", line)
    for name in later:
        log.warning("reload: %s changes only at the next restart", name)
    if not changed and not later:
        log.info("reload: no change")
    return changed + [f"{name}: changes at the next restart" for name in later]
