"""Rendering findings: aligned text for people, JSON for scripts (same content)."""

from __future__ import annotations

import json
import textwrap
from collections import Counter
from collections.abc import Sequence
from typing import Any

from gpuwarden.base.records import record
from gpuwarden.doctor.facts import Facts
from gpuwarden.doctor.findings import FAIL, LEVELS, WARN, Finding, exit_code
from gpuwarden.machine.inventory import dotted

WIDTH = 100


def summary(findings: Sequence[Finding]) -> dict[str, int]:
    counts = Counter(f.level for f in findings)
    return {level: counts.get(level, 0) for level in reversed(LEVELS)}


def text(facts: Facts, findings: Sequence[Finding], *, verbose: bool = False) -> str:
    snap = facts.snapshot
    where = snap.hostname + (f" ({snap.source})" if snap.source != "nvml" else "")
    lines = [f"gpuwarden doctor: {where}"]
    width = max((len(f.check) for f in findings), default=8)
    indent = " " * (6 + width + 2)
    for f in findings:
        head = f"{f.level:<4}  {f.check:<{width}}  "
        lines.extend(_wrap(f.title, head, indent))
        if f.saw and (verbose or f.level != "PASS"):
            lines.extend(_wrap(f.saw, indent + "saw: ", indent + "     "))
        if f.fix:
            # Never wrapped: a fix is often a command that must copy as one line.
            lines.append(f"{indent}fix: {f.fix}")
    counts = summary(findings)
    lines.append(
        "summary: "
        + ", ".join(f"{n} {level}" for level, n in counts.items() if n)
        + (" -> exit 1" if counts.get(FAIL) else " -> exit 0")
    )
    return "\n".join(lines) + "\n"


def _wrap(body: str, first: str, rest: str) -> list[str]:
    return textwrap.wrap(
        body,
        width=max(WIDTH, len(first) + 40),
        initial_indent=first,
        subsequent_indent=rest,
        break_long_words=False,
        break_on_hyphens=False,
    ) or [first.rstrip()]


def as_json(facts: Facts, findings: Sequence[Finding]) -> str:
    return json.dumps(document(facts, findings), indent=2, sort_keys=False) + "\n"


def document(facts: Facts, findings: Sequence[Finding]) -> dict[str, Any]:
    snap, t = facts.snapshot, facts.torch
    return {
        "host": snap.hostname,
        "source": snap.source,
        "exit_code": exit_code(findings),
        "summary": summary(findings),
        "findings": [f.to_dict() for f in findings],
        "facts": {
            "driver_version": snap.driver_version,
            "cuda_driver_version": (dotted(snap.cuda_driver_version)),
            "nvml_error": snap.error,
            "gpus": [
                {
                    "index": g.index,
                    "uuid": g.uuid,
                    "name": g.name,
                    "compute_capability": (dotted(g.compute_capability)),
                }
                for g in snap.gpus
            ],
            "torch": {
                "installed": t.installed,
                "version": t.version,
                "cuda": t.cuda,
                "hip": t.hip,
                "arch_list": list(t.arch_list) if t.arch_list is not None else None,
                "arch_source": t.arch_source or None,
                "nccl": t.nccl,
                "nccl_version": t.nccl_version,
                "cudnn": t.cudnn,
                "mps": t.mps,
                "error": t.error,
            },
            "platform": facts.platform,
            "python": facts.python,
        },
    }


@record
class Report:
    """What `gpuwarden.doctor.check()` and `diagnose()` return."""

    findings: tuple[Finding, ...]
    facts: Facts

    @property
    def ok(self) -> bool:
        return not any(f.level == FAIL for f in self.findings)

    def problems(self) -> tuple[Finding, ...]:
        return tuple(f for f in self.findings if f.level in (WARN, FAIL))

    def text(self, verbose: bool = False) -> str:
        return text(self.facts, self.findings, verbose=verbose)
