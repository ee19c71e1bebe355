"""A doctor's finding: what was checked, how bad it is, what was seen, and the exact fix."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Optional

from gpuwarden.base.records import record

PASS, INFO, SKIP, WARN, FAIL = "PASS", "INFO", "SKIP", "WARN", "FAIL"
LEVELS = (PASS, INFO, SKIP, WARN, FAIL)  # mildest first


@record
class Finding:
    """One check's verdict: what was seen and how to fix it."""

    check: str  # e.g. "driver", "torch.build", "kernels"
    level: str  # one of LEVELS
    title: str  # one line: the verdict
    saw: str = ""  # the facts behind it
    fix: str = ""  # a command or a setting; empty when nothing to do
    gpu: Optional[str] = None  # UUID, when about one GPU

    def to_dict(self) -> dict[str, object]:
        return {
            "check": self.check,
            "level": self.level,
            "title": self.title,
            "saw": self.saw,
            "fix": self.fix,
            "gpu": self.gpu,
        }


def worst(findings: Iterable[Finding]) -> str:
    levels = [f.level for f in findings]
    return max(levels, key=LEVELS.index) if levels else PASS


def exit_code(findings: Iterable[Finding]) -> int:
    """0 when nothing FAILed, 1 otherwise (WARN does not fail the command)."""
    return 1 if any(f.level == FAIL for f in findings) else 0
