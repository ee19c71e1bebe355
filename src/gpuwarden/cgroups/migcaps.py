"""The nvidia-caps device nodes of MIG slices: which node opens which slice.

A process uses a MIG slice through its parent GPU's `/dev/nvidiaN` *and* two
capability nodes, `/dev/nvidia-caps/nvidia-capM`: one for the slice's GPU instance
and one for its compute instance. Fencing a job to its slice (`gpuwarden.cgroups.devices`)
therefore denies the capability nodes of every other slice. Their numbers come from
the driver's own files, never from a guess:

- `/proc/devices`: the major of `nvidia-caps` (allocated at load, so it differs
  between machines);
- `/proc/driver/nvidia/capabilities/gpu<N>/mig/gi<G>/access` and
  `.../gi<G>/ci<C>/access` exist for each GPU and compute instance there is, with
  `DeviceFileMinor: M`; `/proc/driver/nvidia-caps/mig-minors` lists the same
  minors (`gpu<N>/gi<G>/ci<C>/access M`) and is read where an access file lacks it.

`<N>` is the GPU's minor (its `/dev/nvidiaN`). Every path is under `root` ("/" on a
real machine; the simulator keeps stand-ins under a directory of its own,
`gpuwarden.sim.driverfiles`). What a file says is bounded and parsed strictly: a
line that does not parse is skipped, never guessed at.
"""

from __future__ import annotations

import os
import re

from gpuwarden.base.records import record

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping, Sequence
    from typing import Any, Optional

Slice = tuple[int, int, int]  # (GPU minor, GPU instance id, compute instance id)
Node = tuple[int, int, "Optional[int]"]  # a GPU instance's node (ci None) or a compute one's

DEVICES = "proc/devices"
MIG_MINORS = "proc/driver/nvidia-caps/mig-minors"
CAPABILITIES = "proc/driver/nvidia/capabilities"
_LIMIT = 1 << 20
_TABLE_LINE = re.compile(r"gpu(\d+)/gi(\d+)(?:/ci(\d+))?/access (\d+)")


@record
class Caps:
    """The capability nodes of the MIG instances that exist: `major` of nvidia-caps,
    and each instance's node minor by (GPU minor, GI id, CI id or None)."""

    major: int
    minors: dict[Node, int]


def denied(caps: Caps, keep: Iterable[Slice]) -> tuple[int, ...]:
    """The minors of the capability nodes a job on the slices `keep` may not open: every
    other GPU and compute instance's. The `config` and `monitor` capabilities (who may
    change the split, who may watch it) are nobody's slice and stay as they are."""
    allowed: set[Node] = set()
    for gpu, gi, ci in keep:
        allowed.update({(gpu, gi, None), (gpu, gi, ci)})
    return tuple(sorted({m for node, m in caps.minors.items() if node not in allowed}))


def slices_of(leased: Sequence[Any], gpus: Sequence[Any]) -> list[Slice]:
    """The slices among `leased` (the GPUs a job was given: `mig.devices` units, a MIG
    slice by its `MIG-` UUID), found in `gpus` (the machine's physical GPUs)."""
    where = {
        inst.uuid: (g.minor, inst.gpu_instance_id, inst.compute_instance_id)
        for g in gpus
        if g.mig_mode
        for inst in g.mig_instances
    }
    found = []
    for gpu in leased:
        node = where.get(gpu.uuid)
        if node is not None and None not in node:
            found.append((int(node[0]), int(node[1]), int(node[2])))
    return found


def denied_for(
    leased: Sequence[Any], gpus: Sequence[Any], root: Optional[str] = None
) -> Optional[tuple[int, tuple[int, ...]]]:
    """(nvidia-caps major, minors) of the capability nodes of the MIG slices not among
    `leased` (a job's GPUs, out of the machine's `gpus`); None on a machine without MIG
    or where the driver's files do not say. `root`: where those files are (default:
    `driver_root()`)."""
    if not any(getattr(g, "mig_mode", False) for g in gpus):
        return None
    caps = read(driver_root() if root is None else root)
    minors = () if caps is None else denied(caps, slices_of(leased, gpus))
    return (caps.major, minors) if caps is not None and minors else None


def read(root: str = "/") -> Optional[Caps]:
    """The capability nodes under `root`, or None where there are none to fence (no
    nvidia-caps major, or no MIG instance)."""
    major = _major(_text(os.path.join(root, DEVICES)))
    if major is None:
        return None
    table = parse_table(_text(os.path.join(root, MIG_MINORS)))
    minors: dict[Node, int] = {}
    base = os.path.join(root, CAPABILITIES)
    for gpu_dir in _listing(base):
        gpu = _number(gpu_dir, "gpu")
        if gpu is None:
            continue
        mig = os.path.join(base, gpu_dir, "mig")
        for gi_dir in _listing(mig):
            gi = _number(gi_dir, "gi")
            if gi is None:
                continue
            _add(minors, table, (gpu, gi, None), os.path.join(mig, gi_dir, "access"))
            for ci_dir in _listing(os.path.join(mig, gi_dir)):
                ci = _number(ci_dir, "ci")
                if ci is not None:
                    _add(minors, table, (gpu, gi, ci), os.path.join(mig, gi_dir, ci_dir, "access"))
    return Caps(major, minors) if minors else None


def parse_table(text: str) -> dict[Node, int]:
    """`mig-minors`: `gpu0/gi1/access 12`, `gpu0/gi1/ci0/access 13`, ... by node."""
    table: dict[Node, int] = {}
    for line in text.splitlines():
        found = _TABLE_LINE.fullmatch(line.strip())
        if found:
            gpu, gi, ci, minor = found.groups()
            table[(int(gpu), int(gi), None if ci is None else int(ci))] = int(minor)
    return table


def _add(minors: dict[Node, int], table: Mapping[Node, int], node: Node, access: str) -> None:
    text = _text(access)
    if not text and not os.path.exists(access):
        return  # a directory without its access file: no instance to fence
    found = re.search(r"^DeviceFileMinor:\s*(\d+)\s*$", text, re.M)
    minor = int(found.group(1)) if found else table.get(node)
    if minor is not None and minor < 1 << 20:
        minors[node] = minor


def _major(text: str) -> Optional[int]:
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[1] == "nvidia-caps" and parts[0].isdigit():
            return int(parts[0])
        if line.startswith("Block devices"):
            break
    return None


def _number(name: str, prefix: str) -> Optional[int]:
    rest = name[len(prefix) :]
    if name.startswith(prefix) and rest.isascii() and rest.isdigit() and len(rest) < 6:
        return int(rest)
    return None


def _listing(path: str) -> list[str]:
    try:
        return sorted(os.listdir(path))[:4096]
    except OSError:
        return []


def _text(path: str) -> str:
    from gpuwarden.files.safefiles import UnsafeFile, read_small

    try:
        raw, _ = read_small(path, _LIMIT, what="driver file")
    except (OSError, UnsafeFile):
        return ""
    return raw.decode("ascii", "replace")


def driver_root() -> str:
    """Where the driver's files are: "/", or the simulator's stand-ins (GPUWARDEN_SIM)."""
    if os.environ.get("GPUWARDEN_SIM"):
        from gpuwarden.sim.driverfiles import provide

        return provide()
    return "/"
