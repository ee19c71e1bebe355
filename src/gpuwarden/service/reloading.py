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
Over the job's life (service.lifecycle), whose enforcement watch takes the new rules.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from gpuwarden.errors import UserError
from gpuwarden.service.lifecycle import Lifecycle

if TYPE_CHECKING:
    from gpuwarden.service.identity import Person
    from gpuwarden.service.settings import Settings

log = logging.getLogger("gpuwarden.serve")


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


class Reloading(Lifecycle):
    def reload_by(self, who: Person, _: None, client: object) -> dict[str, Any]:
        """The `reload` request: an admin's only."""
        if not self.settings.admins.include(who):
            raise UserError("only an admin may reload the service's policy")
        return {"ok": True, "changes": self.reload()}

    def reload(self) -> list[str]:
        """Read the configuration again and put it in force; what changed, one line each.
        Raises UserError ("refused: ...; the policy in force stays") and changes nothing
        when the reading is refused."""
        from gpuwarden.service.settings import RESTART_ONLY, changes

        try:
            new = read_settings(self.options, self.fixed, self.extra_admins)
        except UserError as err:
            log.error("reload refused: %s; the policy in force stays", err)
            raise UserError(f"reload refused: {err}; the policy in force stays") from None
        later = [n for n in RESTART_ONLY if getattr(new, n) != getattr(self.settings, n)]
        new = dataclasses.replace(new, **{n: getattr(self.settings, n) for n in later})
        changed = changes(self.settings, new)
        self.settings = new
        self.watcher().enforcer.rules = new.enforce  # its state between readings stays
        self.pacer.wake()  # new limits and weights may start a job
        self.pacer.touch()  # and change every waiting job's priority
        self.hardware.forget_links()
        for line in changed:
            log.info("reload: %s", line)
        for name in later:
            log.warning("reload: %s changes only at the next restart", name)
        if not changed and not later:
            log.info("reload: no change")
        return changed + [f"{name}: changes at the next restart" for name in later]

    def reload_if_asked(self) -> None:
        """The reload SIGHUP asked for; a refused one is logged (it changes nothing)."""
        if self.reload_asked:
            self.reload_asked = False
            with contextlib.suppress(UserError):  # logged by reload(); the old policy stays
                self.reload()
