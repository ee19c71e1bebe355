"""`gpuwarden status` as a table: a row per GPU, a sub-row per MIG slice, then the leases.

A GPU in MIG mode is shown as nvidia-smi and nvitop show it: its own row (temperature,
power, the whole memory, health, drains), then one row per MIG device (`3:1`: GPU 3,
MIG device 1) with its profile, memory, lease and processes. A slice is what a job is
given (gpuwarden.placement.mig), so its lease and processes are on its row, not the parent's.
"""

from __future__ import annotations

from gpuwarden.base.records import record
from gpuwarden.machine.inventory import Gpu, MigInstance, Snapshot, dotted

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Optional

    from gpuwarden.monitoring.machineview import MachineView

_SHORT_NAMES = ("NVIDIA GeForce ", "NVIDIA ", "Tesla ")


@record
class Status:
    """One frame of `status`: the machine view, with CUDA's view of it from here
    (`visible.resolve`; None without GPUs) and the user it is narrowed to."""

    machine: MachineView
    visible: Any = None
    user: Optional[str] = None


def level(findings: tuple[Any, ...]) -> str:
    from gpuwarden.health.judgement import level as judged

    return judged(tuple(findings))


def cuda_indices(view: Any) -> dict[str, list[int]]:
    """CUDA's indices by UUID: a GPU's under its `GPU-` UUID, a MIG device's (also)
    under its `MIG-` one."""
    found: dict[str, list[int]] = {}
    for dev in getattr(view, "devices", ()):
        found.setdefault(dev.uuid, []).append(dev.cuda_index)
        if getattr(dev, "mig_uuid", None):
            found.setdefault(dev.mig_uuid, []).append(dev.cuda_index)
    return found


def slice_id(gpu: Gpu, inst: MigInstance) -> str:
    """`3:1`: MIG device 1 of GPU 3, the name a slice has in every view."""
    return f"{gpu.index}:{inst.index}"


def slices(gpu: Gpu) -> list[MigInstance]:
    """A GPU's MIG devices in NVML order (none when it is not in MIG mode)."""
    return sorted(gpu.mig_instances, key=lambda m: m.index) if gpu.mig_mode else []


def unleased_pids(gpu: Gpu, held: list[Any], lineage_of: Any) -> set[int]:
    """The pids of `gpu`'s processes that belong to none of the leases `held` on it: no
    lease's job is the process or one of its ancestors (the kernel's /proc), nor labels
    its container (gpuwarden.leases.attribution)."""
    from gpuwarden.leases.attribution import unleased_pids as unleased

    return unleased(gpu, held, lineage_of)


def _pct(value: Optional[int]) -> str:
    return "n/a" if value is None else f"{value}%"


def _power(draw: Optional[float], limit: Optional[float]) -> str:
    """`62/400W`: drawn and the enforced limit, in one narrow column as nvidia-smi's
    Pwr:Usage/Cap; n/a for what NVML does not report."""
    if draw is None:
        return "n/a" if limit is None else f"n/a/{limit:.0f}W"
    return f"{draw:.0f}W" if limit is None else f"{draw:.0f}/{limit:.0f}W"


def _short(name: Optional[str]) -> str:
    if not name:
        return "n/a"
    for prefix in _SHORT_NAMES:
        if name.startswith(prefix):
            return name[len(prefix) :]
    return name


def _lease_mark(held: list[Any]) -> str:
    if not held:
        return "-"
    return ",".join(sorted({x.user + ("(shared)" if x.mem is not None else "") for x in held}))


def _memory(used: Optional[int], total: Optional[int]) -> str:
    from gpuwarden.base.units import format_size

    return f"{format_size(used)} / {format_size(total)}"


def _procs(processes: Any, stray: set[int]) -> str:
    from gpuwarden.base.units import format_size

    return (
        " ".join(
            f"{p.user or '?'}({format_size(p.used_memory)}){'*' if p.pid in stray else ''}"
            for p in processes
        )
        or "-"
    )


def _health_mark(g: Gpu, findings: tuple[Any, ...]) -> str:
    lvl = level(findings)
    if g.lost:
        return "LOST"
    if lvl == "ok":
        return "ok"
    first = getattr(findings[0], "code", "") or findings[0].reason
    more = f"+{len(findings) - 1}" if len(findings) > 1 else ""
    return f"{'FATAL' if lvl == 'fatal' else 'warn'}:{first}{more}"


def to_text(data: Status) -> str:
    from gpuwarden.base.table import render as table

    snap: Snapshot = data.machine.snapshot
    if not snap.gpus and data.user is not None and not snap.error:
        return f"{data.user} holds no GPU, process or lease here"
    if not snap.gpus:
        return snap.error or "no GPUs found"
    view = data.visible
    cuda = cuda_indices(view)
    value = getattr(view, "value", None)
    show_cuda = value is not None or any(
        cuda.get(g.uuid, [g.index])[0] != g.index for g in snap.gpus
    )
    leases: dict[str, list[Any]] = {}
    for x in data.machine.leases:
        leases.setdefault(x.uuid, []).append(x)
    cuda_version = dotted(snap.cuda_driver_version) or "n/a"
    head = f"{snap.hostname}  driver {snap.driver_version or 'n/a'}  CUDA {cuda_version}"
    if snap.source != "nvml":
        head += f"  [{snap.source}]"
    headers = (
        ["GPU"]
        + (["CUDA"] if show_cuda else [])
        + ["NAME", "TEMP", "FAN", "POWER", "UTIL", "MEMORY", "HEALTH", "LEASE", "PROCESSES"]
    )
    rows = []
    notes = []
    # Where leases are in use (a shared machine), a GPU process under none is marked: it
    # is unreserved use, counted against its user's fair share by the queue service.
    if leases:
        from gpuwarden.machine.ancestry import lineage
    unreserved = 0

    def cuda_mark(uuid: str) -> list[str]:
        ids = cuda.get(uuid)
        return [",".join(map(str, ids)) if ids else "-"] if show_cuda else []

    for g in snap.gpus:
        findings = data.machine.findings.get(g.uuid, ())
        for f in findings:
            notes.append(f"GPU {g.index}: {f.reason}" + (f" -> {f.action}" if f.action else ""))
        drain = data.machine.drains.get(g.uuid)
        held = leases.get(g.uuid, [])
        if drain is not None:
            notes.append(f"GPU {g.index}: drained by {drain.by}: {drain.reason}")
        own = slices(g)
        in_slice = {m.uuid for m in own}
        outside = [p for p in g.processes if p.mig_uuid not in in_slice]
        stray = unleased_pids(g, held, lineage) if leases else set()
        unreserved += len(stray & {p.pid for p in outside})
        temp = "n/a" if g.temperature is None else f"{g.temperature}C"
        rows.append(
            [
                str(g.index),
                *cuda_mark(g.uuid),
                _short(g.name) + (" [MIG]" if g.mig_mode else ""),
                temp,
                _pct(g.fan_speed),
                _power(g.power_draw, g.power_limit),
                _pct(g.utilization_gpu),
                "n/a" if g.lost else _memory(g.memory_used, g.memory_total),
                _health_mark(g, findings),
                "drained" if drain is not None else _lease_mark(held),
                _procs(outside, stray),
            ]
        )
        for inst in own:
            mine = held + leases.get(inst.uuid, [])
            procs = [p for p in g.processes if p.mig_uuid == inst.uuid]
            stray = unleased_pids(g, mine, lineage) if leases else set()
            unreserved += len(stray & {p.pid for p in procs})
            # NVML has no utilization, temperature or power per MIG device.
            rows.append(
                [
                    slice_id(g, inst),
                    *cuda_mark(inst.uuid),
                    f"  MIG {inst.name or 'n/a'}",
                    "",
                    "",
                    "",
                    "n/a",
                    _memory(inst.memory_used, inst.memory_total),
                    "",
                    "drained" if drain is not None else _lease_mark(leases.get(inst.uuid, [])),
                    _procs(procs, stray),
                ]
            )
    right = {0, 3, 4, 5, 6} if not show_cuda else {0, 1, 4, 5, 6, 7}  # numbers line up
    lines = [head, table(headers, rows, right=sorted(right))]
    if value is not None:
        lines.append(f"CUDA_VISIBLE_DEVICES={value!r} (CUDA column: the index a CUDA program sees)")
    if unreserved:
        lines.append("* a process under no lease: unreserved use (see `gpuwarden enforce`)")
    for text in list(getattr(view, "problems", ())) + list(getattr(view, "warnings", ())):
        lines.append(f"warning: {text}")
    order = [u for g in snap.gpus for u in (g.uuid, *(m.uuid for m in slices(g)))]
    held_rows = _lease_rows(snap, [x for u in order for x in leases.get(u, [])])
    if held_rows:
        lines.append("")
        lines.append(
            table(
                ["LEASE", "USER", "JOB", "PID", "AGE", "EXPIRES", "COMMAND"],
                held_rows,
                right=[3, 4],
            )
        )
    if data.machine.lease_error:
        lines.append(f"warning: cannot read leases: {data.machine.lease_error}")
    lines.extend(notes)
    return "\n".join(lines)


def _lease_rows(snap: Snapshot, held: list[Any]) -> list[list[str]]:
    """One row per lease: `GPU n` (`GPU n:m` on a MIG slice, with `shared` for a
    declared-memory lease), its job id, user, age and when it expires (`with job`: it
    ends when its process tree does)."""
    from gpuwarden.base.units import format_size, format_span

    name = {g.uuid: str(g.index) for g in snap.gpus}
    name.update({m.uuid: slice_id(g, m) for g in snap.gpus for m in slices(g)})
    rows = []
    for x in held:
        gpu = f"GPU {name.get(x.uuid, '?')}"
        if x.mem is not None:
            gpu += f" shared {format_size(x.mem)}"
        if x.expires is None:
            expires = "with job"
        elif x.expires <= snap.taken_at:
            expires = "now"
        else:
            expires = "in " + format_span(x.expires - snap.taken_at)
        age = format_span(max(0.0, snap.taken_at - x.started))
        rows.append([gpu, x.user, x.job or "-", str(x.pid), age, expires, x.command or "-"])
    return rows
