"""Where gpuwarden keeps its shared state: the lease directory and the state directory
(drains, the wait line, the XID log). The system directories when an admin created
them (shared by every local user), else per-user ones; `lease.dir` and `state.dir`
(or their variables) override both.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from gpuwarden.config.keys import SYSTEM_LEASE_DIR, SYSTEM_STATE_DIR

TYPE_CHECKING = False
if TYPE_CHECKING:
    from gpuwarden.config import Config


def _user_state_base(environ: Mapping[str, str]) -> str:
    base = environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")
    return os.path.join(base, "gpuwarden")


def state_location(config: Config | None = None) -> str:
    """Where drains, the wait queue and the XID log live: `state.dir` if set, else the
    system directory when an admin created it (shared by every local user), else a
    per-user one under $XDG_STATE_HOME (~/.local/state). Not created here. A string:
    the status and run paths do not import pathlib."""
    explicit = os.environ.get("GPUWARDEN_STATE_DIR")
    if explicit and config is None:
        return os.path.abspath(explicit)
    if config is None:
        from gpuwarden.config import load

        config = load()
    if config.get("state.dir"):
        return config.get("state.dir")
    if os.path.isdir(SYSTEM_STATE_DIR):
        return SYSTEM_STATE_DIR
    return _user_state_base(os.environ)


def lease_location(config: Config | None = None) -> str:
    """Where lease lock files live: `lease.dir` if set, else the system directory when an
    admin created it (so every local user's jobs see each other's leases), else a
    per-user one under $XDG_STATE_HOME. Not $XDG_RUNTIME_DIR: logind removes that at
    logout while a `nohup` job may still hold its lock, and a fresh lock file there
    would let a second job take the same GPU. Not created here. A string: the status
    and run paths do not import pathlib."""
    explicit = os.environ.get("GPUWARDEN_LEASE_DIR")
    if explicit and config is None:
        return os.path.abspath(explicit)
    if config is None:
        from gpuwarden.config import load

        config = load()
    if config.get("lease.dir"):
        return config.get("lease.dir")
    if os.path.isdir(SYSTEM_LEASE_DIR):
        return SYSTEM_LEASE_DIR
    return os.path.join(_user_state_base(os.environ), "leases")
