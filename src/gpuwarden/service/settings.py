"""What `gpuwarden serve` is told: the [service] table, the scheduling policy, the admins.

A plain record, read once at start (`cli/serve.py`), that every part of the service
reads and none changes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from gpuwarden import scheduling
from gpuwarden.enforcement import Policy
from gpuwarden.service.identity import Admins


@dataclass(frozen=True)
class Settings:
    """What `gpuwarden serve` is told by its configuration ([service] table)."""

    socket: str
    state_dir: str
    lease_dir: Optional[str] = None
    policy: scheduling.Policy = field(default_factory=scheduling.Policy)
    admins: Admins = field(default_factory=Admins)
    max_jobs_per_user: Optional[int] = None
    max_time: Optional[float] = None
    show_commands: bool = False
    grace: float = 30.0  # SIGTERM to SIGKILL past a time limit
    webhook: Optional[str] = None  # POSTed a JSON event when a job ends
    sendmail: Optional[str] = None  # mails the owner when a job ends
    devices: str = "auto"  # enforce.devices: a device cgroup per job (auto, off, require)
    enforce: Policy = field(default_factory=Policy)  # the [enforce] policies it applies
    enforce_every: float = 5.0  # enforce.poll_seconds
    tick: float = 1.0
    max_clients: int = 512  # connections of everyone at once
    max_clients_per_user: int = 64  # service.max_connections_per_user: below max_clients
    idle_timeout: float = 30.0  # a client that sends no whole request for this long is dropped
    max_command_bytes: int = 64 << 10  # service.max_command_bytes: a job's command line
    max_env_bytes: int = 256 << 10  # service.max_env_bytes: a job's environment
