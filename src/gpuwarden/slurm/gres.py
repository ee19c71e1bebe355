"""`gres.conf` and the `NodeName=` line for this machine, from a Snapshot (pure), plus
the few facts NVML gives beyond a Snapshot (device minor numbers, CPU affinity).

For sites whose Slurm is built without NVML autodetection (`AutoDetect=nvml`),
an admin writes one `Name=gpu File=/dev/nvidiaN` line per GPU. N is the GPU's
*minor number* (what /dev/nvidiaN is), which NVML gives; where it cannot be
read (a simulated machine that does not model it) the NVML index stands in and
the output says so. `Cores=` is the GPU's CPU affinity (the cores near it), and
`Links=` the NVLink count to each other GPU, in gres.conf order, with -1 for
itself, as Slurm's own NVML plugin writes them.

The order of the lines is the NVML index order; Slurm numbers a job's GPUs
(SLURM_JOB_GPUS) by their position in gres.conf, so with this file those
numbers are NVML indices, which is what `gpuwarden slurm prolog` relies on.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Sequence
from typing import Any, Optional

from gpuwarden.base.records import record
from gpuwarden.base.units import is_digits


@record
class GresDevice:
    """One GPU as Slurm's gres.conf names it: its index, device node and nearby CPUs."""

    index: int  # NVML index
    minor: Optional[int]  # /dev/nvidia<minor>; None when NVML could not say
    cores: Optional[str] = None  # CPU list near the GPU, Slurm's form: 0-15,32-47


def cpu_list(cpus: Sequence[int]) -> str:
    """[0, 1, 2, 5] -> `0-2,5`."""
    out: list[str] = []
    ordered = sorted(set(cpus))
    i = 0
    while i < len(ordered):
        j = i
        while j + 1 < len(ordered) and ordered[j + 1] == ordered[j] + 1:
            j += 1
        out.append(str(ordered[i]) if i == j else f"{ordered[i]}-{ordered[j]}")
        i = j + 1
    return ",".join(out)


def links_of(index: int, order: Sequence[int], nvlinks: dict[tuple[int, int], int]) -> str:
    cells = []
    for other in order:
        if other == index:
            cells.append("-1")
        else:
            cells.append(str(nvlinks.get((min(index, other), max(index, other)), 0)))
    return ",".join(cells)


def gres_lines(
    snapshot: Any,
    devices: Sequence[GresDevice],
    *,
    dev_dir: str = "/dev",
    gpu_type: Optional[str] = None,
    mig_minors: Optional[dict[str, int]] = None,
) -> list[str]:
    """One `Name=gpu ... File=...` line per GPU, in NVML index order; a GPU in MIG mode
    gives one `MultipleFiles=` line per MIG device instead (gpuwarden.slurm.miggres),
    and then every GPU is typed (`--type`, else its model), as Slurm's own NVML
    detection types them, and `Links=` is left out (Slurm pairs links with whole GPUs)."""
    from gpuwarden.slurm import miggres

    ordered = sorted(devices, key=lambda d: d.index)
    order = [d.index for d in ordered]
    by_index = {g.index: g for g in getattr(snapshot, "gpus", ())}
    migs = {i for i, g in by_index.items() if getattr(g, "mig_mode", None) and g.mig_instances}
    root = dev_dir.rstrip("/") or ""
    lines = []
    for dev in ordered:
        number = dev.index if dev.minor is None else dev.minor
        cores = [f"Cores={dev.cores}"] if dev.cores else []
        if dev.index in migs:
            gpu = by_index[dev.index]
            for inst in sorted(gpu.mig_instances, key=lambda m: m.index):
                line = miggres.mig_line(gpu, inst, number, root, mig_minors)
                lines.append(" ".join([line, *cores]))
            continue
        parts = ["Name=gpu"]
        kind = gpu_type or (miggres.short_model(by_index[dev.index].name) if migs else None)
        if kind:
            parts.append(f"Type={kind}")
        parts.append(f"File={root}/nvidia{number}")
        parts += cores
        if snapshot.nvlinks and not migs:
            parts.append(f"Links={links_of(dev.index, order, snapshot.nvlinks)}")
        lines.append(" ".join(parts))
    return lines


def node_line(
    hostname: str,
    gpus: int,
    *,
    cpus: int,
    memory_mib: Optional[int],
    gpu_type: Optional[str] = None,
    gres: Optional[str] = None,
) -> str:
    """slurm.conf's line for this node. `slurmd -C` prints the full hardware line
    (sockets, cores, threads); this one adds what it lacks, the GPUs (`gres`, from
    `miggres.counts` of the gres.conf lines, else `gpu:[TYPE:]N`)."""
    parts = [f"NodeName={hostname.split('.', 1)[0]}", f"CPUs={cpus}"]
    if memory_mib:
        parts.append(f"RealMemory={memory_mib}")
    if gres:
        parts.append(f"Gres={gres}")
    elif gpus:
        parts.append(f"Gres=gpu:{gpu_type + ':' if gpu_type else ''}{gpus}")
    return " ".join(parts)


def notes(devices: Sequence[GresDevice]) -> list[str]:
    """What the lines could not say from NVML, for a comment above them."""
    out = []
    if any(d.minor is None for d in devices):
        out.append(
            "NVML gave no device minor numbers here: File= uses the NVML index, which on "
            "most machines, not all, is the minor; check with `ls -l /dev/nvidia*`"
        )
    if any(d.cores is None for d in devices):
        out.append("NVML gave no CPU affinity here: Cores= is left out (any core may be used)")
    return out


# --- reading the facts (not pure) ------------------------------------------------------------


def read_devices(snapshot: Any, nvml: Any = None) -> list[GresDevice]:
    """Minor numbers and CPU affinity of the Snapshot's GPUs; None where NVML (or, for
    the affinity, sysfs) cannot say.

    The one place outside `inventory` that asks NVML, for two facts a Snapshot does not
    carry yet; a Gpu with `minor` / `cpu_affinity` fields is taken at its word, so this
    shrinks to nothing once the inventory reads them."""
    if all(getattr(g, "minor", None) is not None for g in snapshot.gpus):
        return [
            GresDevice(g.index, g.minor, _cores_field(getattr(g, "cpu_affinity", None)))
            for g in snapshot.gpus
        ]
    if nvml is None:
        from gpuwarden.machine.inventory import load_nvml

        try:
            nvml = load_nvml()
        except ImportError:
            nvml = None
    handles: dict[int, Any] = {}
    if nvml is not None:
        try:
            nvml.nvmlInit()
        except Exception:
            nvml = None
    try:
        out = []
        for gpu in snapshot.gpus:
            handle = None
            if nvml is not None:
                try:
                    handle = nvml.nvmlDeviceGetHandleByIndex(gpu.index)
                except Exception:
                    handle = None
            handles[gpu.index] = handle
            out.append(
                GresDevice(
                    index=gpu.index,
                    minor=_minor(nvml, handle),
                    cores=_affinity(nvml, handle, gpu.pci_bus_id),
                )
            )
        return out
    finally:
        if nvml is not None:
            with contextlib.suppress(Exception):
                nvml.nvmlShutdown()


def _cores_field(value: Any) -> Optional[str]:
    """A Snapshot's CPU affinity (a list of CPUs, or Slurm-style text) as Cores=."""
    if not value:
        return None
    return value if isinstance(value, str) else cpu_list(list(value))


def _minor(nvml: Any, handle: Any) -> Optional[int]:
    if handle is None:
        return None
    try:
        return int(nvml.nvmlDeviceGetMinorNumber(handle))
    except Exception:
        return None


def _affinity(nvml: Any, handle: Any, bus_id: Optional[str]) -> Optional[str]:
    cpus: list[int] = []
    if handle is not None:
        words = max(1, -(-(os.cpu_count() or 1) // 64))
        try:
            masks = nvml.nvmlDeviceGetCpuAffinity(handle, words)
            for w, mask in enumerate(masks):
                cpus += [w * 64 + b for b in range(64) if int(mask) >> b & 1]
        except Exception:
            cpus = []
    if not cpus and bus_id:
        cpus = _sysfs_cpus(bus_id)
    return cpu_list(cpus) if cpus else None


def _sysfs_cpus(bus_id: str) -> list[int]:
    """The PCI device's local CPUs from sysfs (`0000:07:00.0`; NVML writes 8 digits of
    domain)."""
    bus = bus_id.lower()
    if len(bus) > 12 and bus.count(":") == 2:
        bus = bus[-12:]
    try:
        with open(f"/sys/bus/pci/devices/{bus}/local_cpulist") as fh:
            text = fh.read().strip()
    except OSError:
        return []
    cpus: list[int] = []
    for part in text.split(","):
        a, _, b = part.partition("-")
        if is_digits(a):
            cpus += range(int(a), int(b or a) + 1) if is_digits(b or a) else []
    return cpus


def memory_mib() -> Optional[int]:
    """MemTotal in MiB, as slurmd counts RealMemory."""
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemTotal:"):
                    return int(line.split()[1]) // 1024
    except (OSError, ValueError, IndexError):
        return None
    return None
