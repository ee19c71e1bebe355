"""Health judgement of a GPU: pure functions over `Gpu` snapshots (plus XID events)."""

from __future__ import annotations

from dataclasses import dataclass

from gpuwarden.inventory import Gpu

OK, WARNING, FATAL = "ok", "warning", "fatal"


@dataclass(frozen=True)
class Finding:
    level: str  # OK, WARNING or FATAL
    reason: str  # what was seen, one line
    action: str = ""  # NVIDIA's recommended action


def judge(gpu: Gpu, xids: tuple[int, ...] = ()) -> tuple[Finding, ...]:
    """Every finding for one GPU; empty means healthy. A first cut, refined by the
    health work (XID catalogue, throttling, correctable-ECC rates)."""
    found = []
    if gpu.lost:
        found.append(Finding(FATAL, "GPU is lost (fallen off the bus)", "reset the GPU or reboot"))
    if gpu.ecc_uncorrected_volatile:
        found.append(
            Finding(
                FATAL,
                f"{gpu.ecc_uncorrected_volatile} uncorrected ECC errors",
                "drain, then reset the GPU",
            )
        )
    if gpu.remapped_rows_failure:
        found.append(Finding(FATAL, "row remapping failed", "RMA the GPU"))
    if gpu.remapped_rows_pending or gpu.retired_pages_pending:
        found.append(Finding(FATAL, "memory repair pending", "reset the GPU to apply it"))
    return tuple(found)


def level(findings: tuple[Finding, ...]) -> str:
    """The worst level among findings (OK for none)."""
    levels = {f.level for f in findings}
    return FATAL if FATAL in levels else WARNING if WARNING in levels else OK
