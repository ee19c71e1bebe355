"""`gpuwarden doctor`: find the environment problems before they cost an afternoon.

Facts are gathered once (`facts.gather`), judged by pure checks
(`checks.run_checks`) into `Finding`s (PASS/INFO/SKIP/WARN/FAIL, what was
seen, the exact fix), and rendered by `report`. From inside a training
script, `gpuwarden.doctor.check()` runs the same checks plus the in-process
one (CUDA_VISIBLE_DEVICES changed after torch/CUDA already looked).
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Optional, TextIO

if TYPE_CHECKING:
    from gpuwarden.doctor.report import Report

__all__ = ["FAIL", "INFO", "PASS", "SKIP", "WARN", "Finding", "Report", "check", "diagnose"]


def __getattr__(name: str) -> Any:
    # Resolved on first use, so that `gpuwarden doctor` can import its torch probe
    # (gpuwarden.doctor.probe) and start it before paying for anything else.
    if name == "Report":
        from gpuwarden.doctor.report import Report

        return Report
    if name in ("FAIL", "INFO", "PASS", "SKIP", "WARN", "Finding"):
        from gpuwarden.doctor import findings

        return getattr(findings, name)
    raise AttributeError(f"module 'gpuwarden.doctor' has no attribute {name!r}")


def diagnose(
    *,
    environ: Optional[Mapping[str, str]] = None,
    probe_torch: bool = True,
    in_process: bool = False,
) -> Report:
    from gpuwarden.doctor.checks import run_checks
    from gpuwarden.doctor.facts import gather
    from gpuwarden.doctor.report import Report

    facts = gather(environ=environ, probe_torch=probe_torch, in_process=in_process)
    return Report(tuple(run_checks(facts)), facts)


def check(*, print_report: bool = True, file: Optional[TextIO] = None) -> Report:
    """Run the doctor from inside a script (after your imports, before training).

    Uses the torch this process already imported, if any, and warns when
    CUDA_VISIBLE_DEVICES changed after torch or CUDA had already read it.
    Prints the problems (WARN/FAIL) to stderr unless `print_report=False`.
    """
    result = diagnose(probe_torch=False, in_process=True)
    if print_report:
        out = file or sys.stderr
        problems = result.problems()
        if problems:
            for f in problems:
                print(f"gpuwarden doctor: {f.level} {f.check}: {f.title}", file=out)
                if f.fix:
                    print(f"    fix: {f.fix}", file=out)
    return result
