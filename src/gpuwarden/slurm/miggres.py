"""gres.conf lines for MIG devices (pure, but for reading the driver's minors file).

Slurm schedules each MIG device as a GPU of its own, typed by its parent's model and
its profile (`a100_3g.40gb`, as Slurm's NVML autodetection names them), and, instead
of `File=`, names every device file a job on it needs with `MultipleFiles=`: the parent
GPU's `/dev/nvidia<minor>` and the slice's two capability devices,
`/dev/nvidia-caps/nvidia-cap<N>` for its GPU instance and for its compute instance
(gres.conf(5), MultipleFiles). N comes from the driver's own table,
`/proc/driver/nvidia-caps/mig-minors` (`gpu3/gi2/access 291`,
`gpu3/gi2/ci0/access 292`); where it cannot be read, from the rule that table follows
(3 + 135 per GPU + 9 per GPU instance, + 1 + the compute instance), and a comment
says so.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Optional

from gpuwarden.base.units import is_digits

MIG_MINORS = "/proc/driver/nvidia-caps/mig-minors"


def short_model(name: Optional[str]) -> str:
    """`NVIDIA A100-SXM4-80GB` -> `a100`; `NVIDIA RTX A6000` -> `rtx_a6000`: the model as a
    gres type word (letters, digits, `_`, `.`)."""
    text = (name or "gpu").strip()
    for prefix in ("NVIDIA ", "Tesla "):
        if text.startswith(prefix):
            text = text[len(prefix) :]
    word = text.split("-", 1)[0].strip().lower().replace(" ", "_")
    word = "".join(c for c in word if c.isalnum() or c in "_.")
    return word or "gpu"


def read_minors(path: str = MIG_MINORS) -> Optional[dict[str, int]]:
    """The driver's table of capability minors (`gpu0/gi1/access` -> 12); None when it
    cannot be read (no driver here, a simulated machine)."""
    try:
        with open(path) as fh:
            text = fh.read(1 << 20)
    except OSError:
        return None
    out = {}
    for line in text.splitlines():
        key, _, value = line.strip().partition(" ")
        if is_digits(value.strip()):
            out[key] = int(value)
    return out


def cap_minors(
    gpu_minor: int, gi: int, ci: int, table: Optional[Mapping[str, int]]
) -> tuple[int, int]:
    """(GPU instance's, compute instance's) capability minors."""
    gi_key, ci_key = f"gpu{gpu_minor}/gi{gi}/access", f"gpu{gpu_minor}/gi{gi}/ci{ci}/access"
    if table is not None and gi_key in table and ci_key in table:
        return table[gi_key], table[ci_key]
    base = 3 + gpu_minor * 135 + gi * 9
    return base, base + 1 + ci


def mig_type(parent_name: Optional[str], profile: Optional[str]) -> str:
    return f"{short_model(parent_name)}_{(profile or 'mig').lower()}"


def mig_line(
    gpu: Any, inst: Any, minor: int, dev_dir: str, table: Optional[Mapping[str, int]]
) -> str:
    """`Name=gpu Type=a100_3g.40gb MultipleFiles=/dev/nvidia3,/dev/nvidia-caps/...`."""
    gi, ci = cap_minors(minor, inst.gpu_instance_id or 0, inst.compute_instance_id or 0, table)
    caps = f"{dev_dir}/nvidia-caps/nvidia-cap"
    files = f"{dev_dir}/nvidia{minor},{caps}{gi},{caps}{ci}"
    return f"Name=gpu Type={mig_type(gpu.name, inst.name)} MultipleFiles={files}"


def counts(lines: list[str]) -> str:
    """A node line's `Gres=` value for these gres.conf lines: `gpu:TYPE:N,...` per type in
    order of appearance, `gpu:N` when none is typed."""
    order: dict[str, int] = {}
    for line in lines:
        kind = ""
        for part in line.split():
            if part.startswith("Type="):
                kind = part[len("Type=") :]
        order[kind] = order.get(kind, 0) + 1
    return ",".join(f"gpu:{k}:{n}" if k else f"gpu:{n}" for k, n in order.items())
