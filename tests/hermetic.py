"""The variables that keep a test's gpuwarden off the machine's own.

Every gpuwarden process a test starts must read the test's configuration, leases,
state and socket, never the system's (/etc/gpuwarden/config.toml, /var/lib/gpuwarden,
/run/gpuwarden): on a lab server where gpuwarden is installed system-wide, its
`max_time`, `[run]` defaults or live service would change what a test sees. conftest's
`isolated` fixture points each of these at the test's own folder; a process started
with an environment of its own (as another user, with a minimal PATH) gets them
through `hermetic()`. CI proves it by running the suite beside a live service with a
restrictive configuration at the default paths (scripts/live-service).
"""

from __future__ import annotations

import os

#: Each of gpuwarden's default system locations, by the variable that moves it.
NAMES = (
    "GPUWARDEN_SYSTEM_CONFIG",  # /etc/gpuwarden/config.toml
    "GPUWARDEN_LEASE_DIR",  # /var/lib/gpuwarden/leases
    "GPUWARDEN_STATE_DIR",  # /var/lib/gpuwarden/state
    "GPUWARDEN_SOCKET",  # /run/gpuwarden/gpuwarden.sock
)


def hermetic() -> dict[str, str]:
    """The test's own values of NAMES, for an environment built from scratch (a
    command's own values set after these win)."""
    return {name: os.environ[name] for name in NAMES if name in os.environ}
