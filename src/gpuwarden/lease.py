"""Leases: a held kernel `flock` on a per-GPU file (see ARCHITECTURE principle 3)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional


@dataclass(frozen=True)
class LeaseInfo:
    """Who holds (part of) a GPU, as recorded beside the lock."""

    uuid: str
    user: str
    pid: int
    command: str
    started: float  # time.time()
    mem: Optional[int] = None  # declared bytes for a shared lease; None = exclusive
    job: Optional[str] = None  # job id / name


def list_leases(lease_dir: Optional[str] = None) -> list[LeaseInfo]:
    """Leases that are held right now (lock actually held by a live holder)."""
    return []  # filled in by the run/lease work
