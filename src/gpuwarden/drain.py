"""Drains: GPUs taken out of service with a reason, persisted and keyed by UUID."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Drain:
    uuid: str
    reason: str
    by: str  # user name, or "gpuwarden-health" for an automatic drain
    at: float  # time.time()
    auto: bool = False  # set by the health watch rather than a person


def list_drains() -> dict[str, Drain]:
    """Current drains by UUID."""
    return {}  # filled in by the run/lease work


def drain(uuid: str, reason: str, *, by: str | None = None, auto: bool = False) -> Drain:
    raise NotImplementedError  # filled in by the run/lease work


def undrain(uuid: str, *, by: str | None = None) -> None:
    raise NotImplementedError  # filled in by the run/lease work
