"""What CUDA_VISIBLE_DEVICES / CUDA_DEVICE_ORDER resolve to, judged by `placement.visible`."""

from __future__ import annotations

from gpuwarden.base.errors import UserError
from gpuwarden.doctor.checks.common import kept_ids, resolution
from gpuwarden.doctor.facts import Facts
from gpuwarden.doctor.findings import FAIL, INFO, PASS, SKIP, WARN, Finding

NAME = "visible"


def check_visible(facts: Facts) -> list[Finding]:
    env, snap = facts.environ, facts.snapshot
    value = env.get("CUDA_VISIBLE_DEVICES")
    shown = "unset" if value is None else repr(value)
    if not snap.gpus:
        if value is not None:
            return [Finding(NAME, INFO, f"CUDA_VISIBLE_DEVICES={shown}, but there are no GPUs")]
        return [Finding(NAME, SKIP, "no NVIDIA GPUs to make visible")]
    try:
        res = resolution(facts)
    except UserError as exc:
        return [Finding(NAME, FAIL, f"CUDA_VISIBLE_DEVICES={shown} is unusable", str(exc))]
    mapping = ", ".join(
        f"cuda:{d.cuda_index}=GPU {d.index}" + (" (MIG)" if d.mig_uuid else "") for d in res.devices
    )
    saw = f"CUDA_VISIBLE_DEVICES={shown}, CUDA_DEVICE_ORDER={env.get('CUDA_DEVICE_ORDER', 'unset')}"
    saw += f" -> {mapping or 'no devices'}"
    kept = ",".join(kept_ids(res))
    found = []
    for problem in res.problems:
        fix = (
            f"export CUDA_VISIBLE_DEVICES={kept}  (what CUDA keeps now; `gpuwarden visible` "
            "lists the IDs)"
            if kept
            else "set CUDA_VISIBLE_DEVICES to indices or full UUIDs from `gpuwarden visible`, "
            "or unset it"
        )
        found.append(Finding(NAME, FAIL, problem, saw, fix))
    if not res.devices and not res.problems:
        found.append(
            Finding(
                NAME,
                WARN,
                f"CUDA_VISIBLE_DEVICES={shown} hides every GPU: torch.cuda.is_available() is False",
                saw,
                "unset CUDA_VISIBLE_DEVICES (or `gpuwarden run -g N -- CMD` to get free GPUs)",
            )
        )
    for warning in res.warnings:
        fix = "export CUDA_DEVICE_ORDER=PCI_BUS_ID" if "CUDA_DEVICE_ORDER" in warning else ""
        found.append(Finding(NAME, WARN, warning, saw, fix))
    if not found:
        found.append(Finding(NAME, PASS, f"CUDA sees {len(res.devices)} device(s)", saw))
    return found
