"""`CUDA_VISIBLE_DEVICES` and `CUDA_DEVICE_ORDER` read the way the CUDA driver reads them.

A typo in `CUDA_VISIBLE_DEVICES` never makes CUDA fail: the driver quietly
exposes fewer GPUs (or none), and a job trains on the wrong card or on the CPU.
So gpuwarden does not guess what a value "means": it reproduces the driver's
own rules, including the surprising ones, and says where reading stopped.
The rules, their sources, and where PyTorch's own reading differs are in
docs/cuda-visible-devices.md; in short:

* entries are separated by commas; whitespace around an entry is ignored;
* an integer entry is read like C's `strtoul`: an optional sign, then digits;
  anything after the digits is ignored (`1abc` is 1);
* `GPU-...` / `MIG-...` entries are UUIDs, matched by unique prefix;
* the first entry that is not a number, is negative, is beyond the device
  count, or is an unknown or ambiguous UUID prefix ends the list: the entries
  before it stay visible, the ones after it are ignored;
* any device named twice makes *no* device visible;
* unset means every device; set but empty means none.

Integer entries count in CUDA's own order, which is not nvidia-smi's unless
`CUDA_DEVICE_ORDER=PCI_BUS_ID`; `cuda_order` models both orders.

Everything here is pure (no NVML, no CUDA): `parse` works on a list of UUIDs,
`resolve` on a `Snapshot`, so the rules can be tested exhaustively.

The writing side, `export_value` and `export_env` (what gpuwarden hands to a
child), lives in `gpuwarden.jobs.launch`: `run` needs it for every job, and this
module's record classes only when a parent `CUDA_VISIBLE_DEVICES` must be read.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence

from gpuwarden.base.errors import UserError
from gpuwarden.base.records import record
from gpuwarden.machine.inventory import Gpu, MigInstance, Snapshot

TYPE_CHECKING = False  # typing stays off the start-up path; annotations need it only here
if TYPE_CHECKING:
    from typing import Optional

FASTEST_FIRST = "FASTEST_FIRST"  # CUDA's default order
PCI_BUS_ID = "PCI_BUS_ID"  # nvidia-smi's (and NVML's) order
DEVICE_ORDERS = (FASTEST_FIRST, PCI_BUS_ID)

# What C's isspace() accepts; str.strip() would also drop Unicode spaces CUDA keeps.
_SPACE = " \t\n\v\f\r"
_DIGITS = "0123456789"


@record
class Parsed:
    """What CUDA makes of one `CUDA_VISIBLE_DEVICES` value.

    `ordinals` are positions into the `uuids` given to `parse` (followed by its
    `mig_uuids`), in the order CUDA will number them. `stopped_at` is the entry
    (whitespace stripped) at which CUDA stopped reading, or that it found twice;
    None when the whole value was read. `problems` explain, one line each, why
    the result is not what the value seems to ask for.
    """

    ordinals: tuple[int, ...]
    problems: tuple[str, ...] = ()
    stopped_at: Optional[str] = None
    duplicate: bool = False  # True: a repeated device emptied the whole list


@record
class VisibleDevice:
    """One device a CUDA program started in this environment would see."""

    cuda_index: int  # torch's cuda:N
    index: int  # NVML index (nvidia-smi's), of the parent GPU for a MIG device
    uuid: str  # the physical GPU's UUID (identity, as everywhere in gpuwarden)
    name: Optional[str]
    mig_uuid: Optional[str] = None  # set when the device is a MIG device of that GPU


@record
class Resolution:
    """The mapping CUDA index -> physical GPU for one environment, with its caveats.

    `problems` say the value is malformed (CUDA ignores part of it, or all);
    `warnings` say the mapping may not be what the user expects even though the
    value is well formed (CUDA order not pinned, MIG limits, lost GPUs).
    """

    devices: tuple[VisibleDevice, ...]
    warnings: tuple[str, ...] = ()
    problems: tuple[str, ...] = ()
    value: Optional[str] = None  # CUDA_VISIBLE_DEVICES as found; None = unset
    device_order: str = FASTEST_FIRST  # the order CUDA actually uses
    stopped_at: Optional[str] = None

    def cuda_index(self, uuid: str) -> Optional[int]:
        """CUDA index of the physical GPU `uuid` (its first device), None if hidden."""
        return next((d.cuda_index for d in self.devices if d.uuid == uuid), None)


# --- parsing ---------------------------------------------------------------------------------


def _leading_int(entry: str) -> Optional[int]:
    """The integer `strtol` reads at the start of `entry`: sign, then ASCII digits."""
    pos = 1 if entry[:1] in ("+", "-") else 0
    end = pos
    while end < len(entry) and entry[end] in _DIGITS:
        end += 1
    if end == pos:
        return None
    number = int(entry[pos:end])
    return -number if entry[:1] == "-" else number


def _match_prefix(entry: str, candidates: Sequence[str]) -> list[int]:
    return [i for i, uuid in enumerate(candidates) if uuid.startswith(entry)]


def parse(value: Optional[str], uuids: Sequence[str], mig_uuids: Sequence[str] = ()) -> Parsed:
    """Read `value` as the CUDA driver does, over devices `uuids` listed in CUDA order.

    Integer entries index `uuids`; `GPU-` prefixes match `uuids`; `MIG-`
    prefixes match `mig_uuids`, whose positions follow those of `uuids` in
    `Parsed.ordinals` (position `len(uuids) + j` is `mig_uuids[j]`).
    """
    count = len(uuids)
    if value is None:
        return Parsed(tuple(range(count)))
    if value == "":
        return Parsed(())
    ordinals: list[int] = []
    problems: list[str] = []
    for number, raw in enumerate(value.split(","), start=1):
        entry = raw.strip(_SPACE)
        where = f"entry {number} ({entry!r})"
        ordinal, problem = _read_entry(entry, where, uuids, mig_uuids)
        if ordinal is None:
            problems.append(f"{problem}: CUDA stops reading there, so {_kept(ordinals)}")
            return Parsed(tuple(ordinals), tuple(problems), stopped_at=entry)
        if problem:
            problems.append(problem)
        if ordinal in ordinals:
            problems.append(
                f"{where} names the same device as entry {ordinals.index(ordinal) + 1}: "
                "a device listed twice makes CUDA expose no GPU at all"
            )
            return Parsed((), tuple(problems), stopped_at=entry, duplicate=True)
        ordinals.append(ordinal)
    return Parsed(tuple(ordinals), tuple(problems))


def _kept(ordinals: list[int]) -> str:
    if not ordinals:
        return "no GPU is visible"
    if len(ordinals) == 1:
        return "only the entry before it counts"
    return f"only the {len(ordinals)} entries before it count"


def _read_entry(
    entry: str, where: str, uuids: Sequence[str], mig_uuids: Sequence[str]
) -> tuple[Optional[int], Optional[str]]:
    """(ordinal, None), (ordinal, remark) for a readable but odd entry, or (None, why not)."""
    if entry.startswith("GPU-"):
        return _read_uuid(entry, where, uuids, 0, "GPU")
    if entry.startswith("MIG-"):
        if entry.startswith("MIG-GPU-"):
            return None, (
                f"{where} is in the MIG-GPU-<uuid>/<gi>/<ci> form of drivers before R470, "
                "which gpuwarden does not model (use the MIG-<uuid> of nvidia-smi -L)"
            )
        return _read_uuid(entry, where, mig_uuids, len(uuids), "MIG device")
    number = _leading_int(entry)
    if number is None:
        return None, f"{where} is neither an index nor a GPU-/MIG- UUID"
    if number < 0:
        return None, f"{where} is negative"
    if number >= len(uuids):
        have = f"indices 0-{len(uuids) - 1}" if uuids else "no GPU"
        return None, f"{where} is beyond the GPUs CUDA can see ({have})"
    digits = entry[1:] if entry[:1] in ("+", "-") else entry
    remark = None
    if any(c not in _DIGITS for c in digits):
        remark = f"{where} is read as {number}: CUDA ignores what follows the digits"
    return number, remark


def _read_uuid(
    entry: str, where: str, candidates: Sequence[str], offset: int, kind: str
) -> tuple[Optional[int], Optional[str]]:
    found = _match_prefix(entry, candidates)
    if not found:
        return None, f"{where} matches no {kind} UUID"
    if len(found) > 1:
        return None, f"{where} is a prefix of {len(found)} {kind} UUIDs and must be unique"
    return offset + found[0], None


# --- order -----------------------------------------------------------------------------------


def effective_order(device_order: Optional[str]) -> str:
    """The order CUDA uses for a `CUDA_DEVICE_ORDER` value: unknown values mean the default."""
    return device_order if device_order in DEVICE_ORDERS else FASTEST_FIRST


def _speed_rank(gpu: Gpu) -> tuple[int, int, int]:
    # Newer compute capability first; unknown last. CUDA does not document its
    # "fastest" measure nor how it breaks ties: this is a model, hence the warning.
    major, minor = gpu.compute_capability or (-1, -1)
    return (-major, -minor, gpu.index)


def cuda_order(gpus: Sequence[Gpu], device_order: Optional[str]) -> tuple[Gpu, ...]:
    """`gpus` in the order CUDA numbers them before `CUDA_VISIBLE_DEVICES` is applied.

    `PCI_BUS_ID` is PCI bus order, which is NVML's index. `FASTEST_FIRST` (the
    default, and what CUDA falls back to for an unrecognised value) is modelled
    as highest compute capability first, ties in PCI bus order.
    """
    by_bus = sorted(gpus, key=lambda g: g.index)
    if effective_order(device_order) == PCI_BUS_ID:
        return tuple(by_bus)
    return tuple(sorted(by_bus, key=_speed_rank))


def _models(gpus: Sequence[Gpu]) -> list[str]:
    seen: dict[tuple[object, object], str] = {}
    for gpu in gpus:
        key = (gpu.name, gpu.compute_capability)
        if key not in seen:
            cc = gpu.compute_capability
            seen[key] = f"{gpu.name or 'unknown'}" + (f" (cc {cc[0]}.{cc[1]})" if cc else "")
    return list(seen.values())


# --- the environment -------------------------------------------------------------------------


def resolve(snapshot: Snapshot, environ: Optional[Mapping[str, str]] = None) -> Resolution:
    """Which GPUs a CUDA program started with `environ` (default: ours) sees, as what index."""
    env = os.environ if environ is None else environ
    value = env.get("CUDA_VISIBLE_DEVICES")
    raw_order = env.get("CUDA_DEVICE_ORDER")
    order = effective_order(raw_order)
    warnings: list[str] = []
    if raw_order is not None and raw_order not in DEVICE_ORDERS:
        warnings.append(
            f"CUDA_DEVICE_ORDER={raw_order!r} is not one CUDA knows "
            f"({' or '.join(DEVICE_ORDERS)}): CUDA uses its default, {FASTEST_FIRST}"
        )
    gpus = cuda_order(snapshot.gpus, order)
    models = _models([g for g in gpus if not g.lost])  # a lost GPU has no name to compare
    if order != PCI_BUS_ID and len(models) > 1:
        warnings.append(
            "the GPUs differ (" + ", ".join(models) + ") and CUDA_DEVICE_ORDER is not "
            "PCI_BUS_ID: CUDA numbers them fastest first by a measure it does not document; "
            "the CUDA indices shown follow gpuwarden's model of it (newest compute "
            "capability first, then PCI bus order). Set CUDA_DEVICE_ORDER=PCI_BUS_ID to "
            "make CUDA's numbers match nvidia-smi's"
        )
    migs: list[tuple[Gpu, MigInstance]] = [
        (gpu, inst)
        for gpu in gpus
        if gpu.mig_mode
        for inst in sorted(gpu.mig_instances, key=lambda m: m.index)
    ]
    parsed = parse(value, [g.uuid for g in gpus], [inst.uuid for _, inst in migs])
    chosen = _apply_mig(gpus, migs, parsed.ordinals, value, warnings)
    for gpu, _ in chosen:
        if gpu.lost:
            warnings.append(
                f"GPU {gpu.index} ({gpu.uuid}) is lost: CUDA may not see it at all, "
                "which would shift the CUDA index of every device after it"
            )
    devices = tuple(
        VisibleDevice(
            cuda_index=i,
            index=gpu.index,
            uuid=gpu.uuid,
            name=_device_name(gpu, inst),
            mig_uuid=inst.uuid if inst else None,
        )
        for i, (gpu, inst) in enumerate(chosen)
    )
    problems = tuple(f"CUDA_VISIBLE_DEVICES={value!r}: {p}" for p in parsed.problems)
    return Resolution(
        devices=devices,
        warnings=tuple(warnings),
        problems=problems,
        value=value,
        device_order=order,
        stopped_at=parsed.stopped_at,
    )


def _device_name(gpu: Gpu, inst: Optional[MigInstance]) -> Optional[str]:
    if inst is None or gpu.name is None:
        return gpu.name
    return f"{gpu.name} MIG {inst.name}" if inst.name else f"{gpu.name} MIG"


def _apply_mig(
    gpus: Sequence[Gpu],
    migs: Sequence[tuple[Gpu, MigInstance]],
    ordinals: Sequence[int],
    value: Optional[str],
    warnings: list[str],
) -> list[tuple[Gpu, Optional[MigInstance]]]:
    """Apply NVIDIA's documented MIG enumeration limits to the parsed devices.

    The MIG user guide: CUDA enumerates a single compute instance per process
    (the first one visible), and no non-MIG GPU once a compute instance is
    enumerated. A MIG-enabled GPU named as a whole (unset value, index, GPU-
    UUID) is taken to expose its MIG devices; NVIDIA does not document that
    case, so it is warned about.
    """
    chosen: list[tuple[Gpu, Optional[MigInstance]]] = []
    for ordinal in ordinals:
        if ordinal >= len(gpus):
            pick = migs[ordinal - len(gpus)]
            if pick not in chosen:
                chosen.append(pick)
            continue
        gpu = gpus[ordinal]
        if not gpu.mig_mode:
            chosen.append((gpu, None))
            continue
        own = [(g, inst) for g, inst in migs if g.uuid == gpu.uuid]
        if not own:
            warnings.append(
                f"GPU {gpu.index} has MIG mode on but no MIG devices: CUDA cannot use it"
            )
        elif value is not None:
            warnings.append(
                f"GPU {gpu.index} has MIG mode on and is named as a whole GPU: which of its "
                "MIG devices CUDA then uses is not documented; name one by its MIG- UUID "
                "(nvidia-smi -L)"
            )
        chosen.extend(pair for pair in own if pair not in chosen)
    mig_devices = [pair for pair in chosen if pair[1] is not None]
    if not mig_devices:
        return chosen
    dropped = [pair for pair in chosen if pair is not mig_devices[0]]
    if dropped:
        whole = sorted(gpu.index for gpu, inst in dropped if inst is None)
        parts = [inst.uuid for _, inst in dropped if inst is not None]
        if whole:
            parts.insert(0, "GPU " + ", ".join(map(str, whole)))
        warnings.append(
            "CUDA enumerates only one MIG device per process, and no other GPU once it "
            "does (NVIDIA MIG user guide, CUDA 11/R450 and 12/R525), so these stay "
            f"hidden: {'; '.join(parts)}. Run one process per MIG device"
        )
    return [mig_devices[0]]


def allowed_uuids(
    snapshot: Snapshot, environ: Optional[Mapping[str, str]] = None
) -> Optional[tuple[str, ...]]:
    """The GPUs a parent CUDA_VISIBLE_DEVICES (a container, a Slurm step) leaves to us,
    by UUID (`MIG-` for a MIG device: a child may be given only what the parent sees);
    None when unset. A malformed value is refused: guessing would pick the wrong card."""
    env = os.environ if environ is None else environ
    if "CUDA_VISIBLE_DEVICES" not in env:
        return None
    res = resolve(snapshot, env)
    if res.problems:
        raise UserError(res.problems[0] + " (fix or unset it)")
    return tuple(d.mig_uuid or d.uuid for d in res.devices)
