"""Loopback ports for the servers a test starts."""

from __future__ import annotations

import contextlib
import socket


def free_port() -> int:
    """A loopback port nothing listens on (bound and closed again): for a server to come,
    or for a peer that does not answer."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def free_port_pair() -> int:
    """A free port whose next one is free too (slurmctld and slurmd listen side by side)."""
    for _ in range(100):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port > 60000:
            continue
        with contextlib.suppress(OSError), socket.socket() as t:
            t.bind(("127.0.0.1", port + 1))
            return port
    raise RuntimeError("no two free ports in a row")
