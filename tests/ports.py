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
    return free_port_run(2)


def free_port_run(count: int) -> int:
    """A free port whose next `count - 1` are free too (slurmctld, slurmd, slurmdbd)."""
    for _ in range(100):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port > 60000:
            continue
        if all(_free(port + i) for i in range(1, count)):
            return port
    raise RuntimeError(f"no {count} free ports in a row")


def _free(port: int) -> bool:
    with contextlib.suppress(OSError), socket.socket() as t:
        t.bind(("127.0.0.1", port))
        return True
    return False
