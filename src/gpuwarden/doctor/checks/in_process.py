"""In-process only: was CUDA_VISIBLE_DEVICES changed after torch (or CUDA) already looked?

CUDA reads CUDA_VISIBLE_DEVICES once, when it initialises; torch also caches
its device count on first use. A script that sets the variable after that
silently keeps the old devices, which is the seeds' "I set the variable but
it still uses every GPU".
"""

from __future__ import annotations

from typing import Optional

from gpuwarden.doctor.checks.common import kept_ids, resolution
from gpuwarden.doctor.facts import Facts
from gpuwarden.doctor.findings import PASS, WARN, Finding

NAME = "in-process"
FIX = (
    "set CUDA_VISIBLE_DEVICES before `import torch` (first lines of the script, or in the shell: "
    "`CUDA_VISIBLE_DEVICES=0 python train.py`), or launch with `gpuwarden run`"
)


def check_in_process(facts: Facts) -> list[Finding]:
    if not facts.in_process:
        return []
    now = facts.environ.get("CUDA_VISIBLE_DEVICES")
    start = (facts.initial_environ or {}).get("CUDA_VISIBLE_DEVICES")
    changed = facts.initial_environ is not None and now != start
    rt = facts.runtime
    if rt is None:
        return [
            Finding(NAME, PASS, "torch is not imported yet: CUDA_VISIBLE_DEVICES still applies")
        ]
    saw = f"CUDA_VISIBLE_DEVICES now {_show(now)}" + (
        f", at start {_show(start)}" if facts.initial_environ is not None else ""
    )
    if rt.cuda_initialized:
        expected = _expected(facts)
        if rt.device_uuids is not None and expected is not None:
            if tuple(rt.device_uuids) != expected:
                return [
                    Finding(
                        NAME,
                        WARN,
                        "CUDA was initialised before CUDA_VISIBLE_DEVICES took its current "
                        f"value: torch uses {len(rt.device_uuids)} device(s), the variable now "
                        f"names {len(expected)}",
                        saw + f"; torch's devices: {', '.join(rt.device_uuids) or 'none'}",
                        FIX,
                    )
                ]
        elif rt.device_count is not None and expected is not None:
            if rt.device_count != len(expected):
                return [
                    Finding(
                        NAME,
                        WARN,
                        f"CUDA was initialised with {rt.device_count} device(s) but "
                        f"CUDA_VISIBLE_DEVICES now names {len(expected)}",
                        saw,
                        FIX,
                    )
                ]
        elif changed:
            return [
                Finding(
                    NAME,
                    WARN,
                    "CUDA_VISIBLE_DEVICES changed after start and CUDA is already initialised: "
                    "the change may not apply",
                    saw,
                    FIX,
                )
            ]
        return [Finding(NAME, PASS, "CUDA is initialised with the devices the variable names", saw)]
    if changed:
        return [
            Finding(
                NAME,
                WARN,
                "CUDA_VISIBLE_DEVICES was changed after torch was imported: it applies only if "
                "nothing has asked torch about devices yet (torch caches device_count())",
                saw,
                FIX,
            )
        ]
    return [
        Finding(NAME, PASS, "torch is imported; CUDA_VISIBLE_DEVICES unchanged since start", saw)
    ]


def _show(value: Optional[str]) -> str:
    return "unset" if value is None else repr(value)


def _expected(facts: Facts) -> Optional[tuple[str, ...]]:
    try:
        res = resolution(facts)
    except Exception:
        return None
    if not facts.snapshot.gpus:
        return None
    return kept_ids(res)
