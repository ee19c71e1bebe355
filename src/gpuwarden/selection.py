"""Which GPUs a request gets: filters, then ranking — a pure function over data.

`choose()` reads a `Snapshot`, the held leases, the drains and the health
findings, and returns a `Choice`; it never touches NVML or the clock, so `run`,
`reserve`, `select`, the wait queue and the Python API all share one policy that
can be tested exhaustively (tests/test_select_properties.py fuzzes its
invariants). The one file it reads, when the caller does not pass the findings,
is the XID log, through `health.judge_all`: the same judgement `status` shows, so
a GPU `status` calls FATAL is never handed out (an XID exists only as a recorded
event; judging the snapshot alone would miss it). docs/selection.md is the
user-facing account of the same rules.

Two kinds of "no": a GPU that can never serve this request on this machine
(outside the allowed set, excluded, unhealthy, drained, wrong model or
capability, too little total memory) and one that cannot serve it *now*
(leased, busy, too little free memory, too busy). When too few GPUs pass the
first kind, `Choice.never_fits` is set so that a waiting client fails at once
instead of waiting forever.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import field

from gpuwarden.errors import UserError
from gpuwarden.inventory import Gpu, Snapshot
from gpuwarden.mig import devices, is_mig
from gpuwarden.records import record
from gpuwarden.units import format_size

TYPE_CHECKING = False  # typing stays off the start-up path; annotations need it only here
if TYPE_CHECKING:
    from typing import Any, Optional, Union

# Kinds of "can never serve", used to word the never-fits message.
_SCOPE, _HEALTH, _FILTER = "scope", "health", "filter"
# How a GPU someone else computes on is passed over, and how to accept one anyway.
_BUSY = "busy: "
_BUSY_HINT = "an exclusive lease avoids GPUs others compute on: --max-util or --gpus accepts them"


@record
class Request:
    """What a job asks for. `count` None means "every GPU in `gpus`", or 1 when `gpus`
    is not given; with both, `count` GPUs are picked among `gpus`. `mem` (bytes) asks
    for a share of a GPU instead of a whole one."""

    count: Optional[int] = None
    gpus: Optional[tuple[str, ...]] = None  # IDs: nvidia-smi indices or UUID prefixes
    min_free: Optional[int] = None  # bytes
    max_util: Optional[float] = None  # percent
    min_capability: Optional[tuple[int, int]] = None
    model: Optional[str] = None  # glob or substring, case-insensitive
    exclude: tuple[str, ...] = ()
    mem: Optional[int] = None  # bytes; None = exclusive
    keep_first_last: bool = True

    @property
    def gpu_count(self) -> int:
        """How many GPUs the request names before the IDs are resolved: what decides,
        ahead of choosing, whether topology matters and how many whole GPUs a waiter
        needs."""
        if self.count is not None:
            return self.count
        return len(self.gpus or ()) or 1

    @classmethod
    def from_config(cls, config: Any, **overrides: Any) -> Request:
        """The request the `run.*` settings describe (see gpuwarden.config); keyword
        arguments (e.g. `mem=`) override."""
        fields = {
            "count": config.get("run.count"),
            "gpus": config.get("run.gpus") or None,
            "min_free": config.get("run.min_free"),
            "max_util": config.get("run.max_util"),
            "min_capability": config.get("run.min_capability"),
            "model": config.get("run.model"),
            "exclude": tuple(config.get("run.exclude") or ()),
            "keep_first_last": bool(config.get("run.keep_first_last")),
        }
        fields.update(overrides)
        return cls(**fields)


@record
class Choice:
    """The outcome: chosen GPUs in PCI (nvidia-smi) order, and why every other GPU was
    passed over. `error` is set when fewer than `count` GPUs fit; `never_fits` when
    they never will on this machine, whatever the leases and current load."""

    gpus: tuple[Gpu, ...]
    passed_over: dict[str, str] = field(default_factory=dict)
    error: Optional[str] = None
    never_fits: bool = False

    @property
    def ok(self) -> bool:
        return self.error is None


def resolve_ids(
    snapshot: Snapshot, ids: Iterable[str], mig: Optional[str] = None
) -> tuple[Gpu, ...]:
    """GPUs named by nvidia-smi indices or UUID prefixes (with or without `GPU-`, any
    case), in the order given, duplicates dropped. An unknown or ambiguous ID raises
    UserError naming it. `mig` says what a GPU in MIG mode stands for: None, the GPU
    itself (as `drain` names GPUs); "devices", its MIG devices one by one (`MIG-`
    prefixes; the GPU named as a whole is refused, naming them: the GPUs a job may be
    given); "expand", all its MIG devices (for --exclude)."""
    units = devices(snapshot) if mig else ()
    found: list[Gpu] = []
    for raw in ids:
        text = str(raw).strip()
        if not text:
            continue
        if text.isdigit():
            matches = [g for g in snapshot.gpus if g.index == int(text)]
        else:
            low = text.lower()
            matches = [
                g
                for g in (*snapshot.gpus, *(u for u in units if is_mig(u)))
                if g.uuid.lower().startswith(low) or g.uuid.lower().startswith("gpu-" + low)
            ]
        if not matches:
            raise UserError(f"unknown GPU {text!r}: {_machine_ids(snapshot)}")
        if len(matches) > 1:
            listed = ", ".join(f"GPU {g.index} ({g.uuid})" for g in matches[:4])
            raise UserError(f"GPU ID {text!r} is ambiguous: it matches {listed}")
        match = matches[0]
        if match.mig_mode and mig == "expand":
            found.extend(u for u in units if u.index == match.index and u not in found)
            continue
        if match.mig_mode and mig == "devices":
            slices = ", ".join(f"{m.uuid} ({m.name or 'n/a'})" for m in match.mig_instances)
            raise UserError(
                f"GPU {match.index} is in MIG mode: CUDA cannot use it as a whole; name one "
                f"of its MIG devices instead: {slices or 'it has none'}"
            )
        if match not in found:
            found.append(match)
    return tuple(found)


def _machine_ids(snapshot: Snapshot) -> str:
    if not snapshot.gpus:
        return "this machine has no GPUs" + (f" ({snapshot.error})" if snapshot.error else "")
    indices = sorted(g.index for g in snapshot.gpus)
    if indices == list(range(indices[0], indices[-1] + 1)) and len(indices) > 2:
        span = f"{indices[0]}-{indices[-1]}"
    else:
        span = ",".join(map(str, indices))
    return f"this machine has GPUs {span} (or use a UUID prefix)"


def _plural(n: int, word: str = "GPU") -> str:
    return f"{n} {word}" + ("" if n == 1 else "s")


def _model_matches(name: Optional[str], pattern: str) -> bool:
    if name is None:
        return False
    low, pat = name.lower(), pattern.lower()
    if any(c in pat for c in "*?["):
        return fnmatch.fnmatchcase(low, pat)
    return pat in low


def _drain_map(drains: Any) -> dict[str, Any]:
    if drains is None:
        return {}
    if isinstance(drains, Mapping):
        return dict(drains)
    return {d.uuid: d for d in drains}


def _only(n: int) -> str:
    return "none is" if n == 0 else f"only {n} is" if n == 1 else f"only {n} are"


def _pct(value: float) -> str:
    return f"{value:g}%"


def choose(
    snapshot: Snapshot,
    request: Request,
    leases: Sequence[Any] = (),
    drains: Union[Mapping[str, Any], Iterable[Any], None] = None,
    allowed: Optional[Collection[str]] = None,
    health: Optional[Mapping[str, Sequence[Any]]] = None,
) -> Choice:
    """Pick `request.count` GPUs. `leases` are `LeaseInfo`s held now, `drains` the
    `Drain`s by UUID (or a list), `allowed` the UUIDs a parent CUDA_VISIBLE_DEVICES
    leaves visible (None = all), `health` the `health.Finding`s by UUID as
    `health.judge_all` gives them (None = judged now by that same function, with the
    recorded XIDs and the configured fatal list). Bad IDs in the request raise
    UserError; "does not fit" is reported in the Choice, not raised."""
    from gpuwarden.health import FATAL, WARNING, judge, judge_all

    named = resolve_ids(snapshot, request.gpus, "devices") if request.gpus else None
    excluded = {g.uuid for g in resolve_ids(snapshot, request.exclude, "expand")}
    count = request.count if request.count is not None else (len(named) if named else 1)
    if count < 0:
        raise UserError(f"invalid GPU count {count}: expected 0 or more")
    allowed_set = None if allowed is None else set(allowed)
    # A GPU in MIG mode is chosen by MIG device; health, drains and whole-GPU leases
    # are the parent GPU's.
    parent = {m.uuid: g.uuid for g in snapshot.gpus if g.mig_mode for m in g.mig_instances}
    physical = snapshot
    if parent:
        from dataclasses import replace

        snapshot = replace(snapshot, gpus=devices(snapshot))
    drain_by_uuid = _drain_map(drains)
    leases_on: dict[str, list[Any]] = {}
    for lease in leases:
        leases_on.setdefault(lease.uuid, []).append(lease)
    lease_pids = {lease.pid for lease in leases}
    if named:
        # An explicitly named GPU outside the parent's set is a mistake worth naming.
        for g in named:
            if allowed_set is not None and g.uuid not in allowed_set:
                raise UserError(
                    f"GPU {g.index} is not visible here: the parent CUDA_VISIBLE_DEVICES "
                    "leaves only " + _visible_list(snapshot, allowed_set)
                )
    named_uuids = None if named is None else {g.uuid for g in named}

    never: dict[str, tuple[str, str]] = {}  # uuid -> (kind, reason)
    busy: dict[str, str] = {}
    warned: dict[str, str] = {}  # uuid -> its health warnings
    room: dict[str, float] = {}  # free bytes as far as this request is concerned
    if health is None:
        health = judge_all(physical.gpus)
    by_uuid = {g.uuid: g for g in physical.gpus}
    for gpu in snapshot.gpus:
        own = parent.get(gpu.uuid, gpu.uuid)
        findings = health[own] if own in health else judge(by_uuid.get(own, gpu))
        fatal = [f.reason for f in findings if f.level == FATAL]
        warnings = [f.reason for f in findings if f.level == WARNING]
        if warnings:
            warned[gpu.uuid] = "; ".join(warnings)
        drain = drain_by_uuid.get(gpu.uuid) or drain_by_uuid.get(own)
        reason = _never_reason(gpu, request, allowed_set, named_uuids, excluded, fatal, drain)
        if not reason and gpu.mig_mode:
            reason = _FILTER, "MIG mode is on but it has no MIG device: CUDA cannot use it"
        if not reason and count > 1 and is_mig(gpu):
            reason = _FILTER, "MIG device: CUDA shows a process one MIG device only"
        if reason:
            never[gpu.uuid] = reason
            continue
        reason, free = _busy_reason(
            gpu,
            request,
            leases_on.get(gpu.uuid, []) + (leases_on.get(own, []) if own != gpu.uuid else []),
            lease_pids,
            named_uuids is not None,
        )
        if reason:
            busy[gpu.uuid] = reason
        else:
            room[gpu.uuid] = free

    candidates = [g for g in snapshot.gpus if g.uuid in room]
    passed = {u: r for u, (_, r) in never.items()}
    passed.update(busy)

    def single_key(g: Gpu) -> tuple[Any, ...]:
        util = g.utilization_gpu if g.utilization_gpu is not None else 101
        return (
            g.uuid in warned,
            request.keep_first_last and g.index == 0,
            -room[g.uuid],
            util,
            g.index,
        )

    candidates.sort(key=single_key)
    if count == 0:
        for g in candidates:
            passed[g.uuid] = "not needed: no GPU asked for"
        return Choice((), passed)
    if len(candidates) < count:
        for g in candidates:
            passed[g.uuid] = f"fits, but fewer than {count} GPUs do"
        usable = len(snapshot.gpus) - len(never)
        if usable < count:
            return Choice(
                (), passed, _never_message(snapshot, count, named, allowed_set, never), True
            )
        reasons = _some(snapshot, busy)
        error = f"asked for {_plural(count)} but {_only(len(candidates))} free now ({reasons})"
        if any(r.startswith(_BUSY) for r in busy.values()):
            error += f"; {_BUSY_HINT}"
        return Choice((), passed, error, False)

    chosen = _best_set(snapshot, candidates, count, warned, request.keep_first_last)
    chosen_uuids = {g.uuid for g in chosen}
    for g in candidates:
        if g.uuid in chosen_uuids:
            continue
        if g.uuid in warned:
            passed[g.uuid] = f"ranked after GPUs without health warnings ({warned[g.uuid]})"
        elif request.keep_first_last and g.index == 0:
            passed[g.uuid] = "kept for last (GPU 0 often drives a display)"
        else:
            util = "n/a" if g.utilization_gpu is None else _pct(g.utilization_gpu)
            passed[g.uuid] = (
                f"not needed: others ranked higher (this one: {format_size(int(room[g.uuid]))} "
                f"free, util {util})"
            )
    return Choice(tuple(sorted(chosen, key=lambda g: g.index)), passed)


def _visible_list(snapshot: Snapshot, allowed: set[str]) -> str:
    indices = [str(g.index) for g in snapshot.gpus if g.uuid in allowed]
    return ("GPUs " + ",".join(indices)) if indices else "no GPU"


def _never_reason(
    gpu: Gpu,
    request: Request,
    allowed: Optional[set[str]],
    named: Optional[set[str]],
    excluded: set[str],
    fatal: list[str],
    drain: Any,
) -> Optional[tuple[str, str]]:
    if allowed is not None and gpu.uuid not in allowed:
        return _SCOPE, "not visible: outside the parent CUDA_VISIBLE_DEVICES"
    if named is not None and gpu.uuid not in named:
        return _SCOPE, "not among the requested GPUs"
    if gpu.uuid in excluded:
        return _FILTER, "excluded"
    if fatal:
        return _HEALTH, "unhealthy: " + "; ".join(fatal)
    if drain is not None:
        return _HEALTH, f"drained by {drain.by}: {drain.reason}"
    want = request.min_capability
    if want is not None:
        have = gpu.compute_capability
        if have is None:
            return _FILTER, f"compute capability n/a (asked for {want[0]}.{want[1]})"
        if tuple(have) < tuple(want):
            return _FILTER, f"compute capability {have[0]}.{have[1]} < {want[0]}.{want[1]}"
    if request.model is not None and not _model_matches(gpu.name, request.model):
        return _FILTER, f"model {gpu.name or 'n/a'} does not match {request.model!r}"
    need = max(request.min_free or 0, request.mem or 0)
    if need and gpu.memory_total is not None and gpu.memory_total < need:
        return _FILTER, (
            f"only {format_size(gpu.memory_total)} in total < {format_size(need)} asked for"
        )
    return None


def _busy_reason(
    gpu: Gpu, request: Request, leases: list[Any], lease_pids: set[int], named: bool = False
) -> tuple[Optional[str], float]:
    """Why the GPU cannot serve the request now (None if it can), and the free memory
    it offers this request (for ranking). `named`: the request names this GPU."""
    free = float(gpu.memory_free) if gpu.memory_free is not None else 0.0
    exclusive = [lease for lease in leases if lease.mem is None]
    blocking = leases if request.mem is None else exclusive
    if blocking:
        lease = blocking[0]
        kind = "" if lease.mem is None else f" (shared, {format_size(lease.mem)})"
        more = f" and {len(blocking) - 1} more" if len(blocking) > 1 else ""
        return f"leased by {lease.user} pid {lease.pid}{kind}{more}", free
    if request.mem is None and request.max_util is None and not named:
        # An exclusive lease does not land on a GPU someone else computes on (a
        # colleague's plain `python train.py`, no lease), however much memory is
        # free: `--min-free` only narrows the idle GPUs. Asking for it is explicit:
        # name the GPU (--gpus), accept a load (--max-util) or take a share (--mem).
        compute = [p for p in gpu.processes if p.kind == "compute" and p.pid not in lease_pids]
        if compute:
            p = compute[0]
            who = f" ({p.user})" if p.user else ""
            more = f" and {len(compute) - 1} more" if len(compute) > 1 else ""
            return (
                f"{_BUSY}pid {p.pid}{who} uses {format_size(p.used_memory)}{more}",
                free,
            )
    if request.mem is not None:
        if gpu.memory_total is None:
            return "memory n/a: cannot judge a shared request", free
        declared = sum(lease.mem for lease in leases)
        ours = sum(p.used_memory or 0 for p in gpu.processes if p.pid in lease_pids)
        # Memory used beyond what gpuwarden jobs declared (or are seen using) belongs
        # to processes gpuwarden did not start.
        others = max(0, (gpu.memory_used or 0) - max(declared, ours))
        free = float(gpu.memory_total - declared - others)
        if declared + others + request.mem > gpu.memory_total:
            return (
                f"no room for {format_size(request.mem)}: {format_size(declared)} declared by "
                f"{_plural(len(leases), 'shared lease')} + {format_size(others)} used by others"
                f" of {format_size(gpu.memory_total)}",
                free,
            )
    if request.min_free is not None:
        if gpu.memory_free is None:
            return "free memory n/a", free
        if gpu.memory_free < request.min_free:
            return (
                f"only {format_size(gpu.memory_free)} free < {format_size(request.min_free)}",
                free,
            )
    if request.max_util is not None and request.max_util < 100:
        # At most 100% is every GPU, whether or not its utilization can be read.
        if gpu.utilization_gpu is None:
            why = " (NVML gives none per MIG device)" if is_mig(gpu) else ""
            return f"utilization n/a{why} (asked for at most {_pct(request.max_util)})", free
        if gpu.utilization_gpu > request.max_util:
            return f"util {_pct(gpu.utilization_gpu)} > {_pct(request.max_util)}", free
    return None, free


def _some(snapshot: Snapshot, reasons: Mapping[str, str], limit: int = 3) -> str:
    """Reasons for a few GPUs, those sharing a reason named together ("GPUs 0,1,2 ...")."""
    grouped: dict[str, list[int]] = {}
    for g in snapshot.gpus:
        if g.uuid in reasons:
            grouped.setdefault(reasons[g.uuid], []).append(g.index)
    parts = [
        f"GPU{'s' if len(ix) > 1 else ''} {','.join(map(str, ix))} {reason}"
        for reason, ix in grouped.items()
    ]
    shown = "; ".join(parts[:limit])
    if len(parts) > limit:
        shown += f"; and {len(parts) - limit} more"
    return shown


def _never_message(
    snapshot: Snapshot,
    count: int,
    named: Optional[tuple[Gpu, ...]],
    allowed: Optional[set[str]],
    never: Mapping[str, tuple[str, str]],
) -> str:
    asked = f"asked for {_plural(count)}"
    if not snapshot.gpus:
        return f"{asked} but {_machine_ids(snapshot)}"
    if named is not None and count > len(named):
        return f"{asked} but only {len(named)} {'was' if len(named) == 1 else 'were'} named"
    if allowed is not None:
        visible = sum(1 for g in snapshot.gpus if g.uuid in allowed)
        if count > visible:
            return (
                f"{asked} but the parent CUDA_VISIBLE_DEVICES leaves only "
                f"{_plural(visible)} visible"
            )
    elif count > len(snapshot.gpus):
        return f"{asked} but this machine has only {_plural(len(snapshot.gpus))}"
    relevant = {u: kr for u, kr in never.items() if kr[0] != _SCOPE}
    usable = len(snapshot.gpus) - len(never)
    kinds = {k for k, _ in relevant.values()}
    phrase = "healthy and not drained" if kinds == {_HEALTH} else "suitable for this request"
    reasons = _some(snapshot, {u: r for u, (_, r) in relevant.items()})
    return f"{asked} but {_only(usable)} {phrase} ({reasons})"


def _pair_cost(snapshot: Snapshot, a: Gpu, b: Gpu) -> int:
    """0 for an NVLink, else NVML's topology level / 10 (1 = same PCIe switch ... 5 =
    across sockets); unknown counts as the farthest."""
    key = (min(a.index, b.index), max(a.index, b.index))
    if snapshot.nvlinks.get(key):
        return 0
    level = snapshot.topology.get(key)
    return 5 if level is None else max(0, level // 10)


def _best_set(
    snapshot: Snapshot,
    ranked: list[Gpu],
    count: int,
    warned: Collection[str],
    keep_first_last: bool,
) -> list[Gpu]:
    """The best `count` GPUs among `ranked` (best first): fewest health warnings, one
    model, GPU 0 only if needed, closest links, then the individual ranking. Grown
    greedily from every seed (n^2 k work) rather than by trying every subset, which
    is enough for the topologies machines have (pairs, switches, sockets)."""
    if count == 1:
        return ranked[:1]
    position = {g.uuid: i for i, g in enumerate(ranked)}

    def is_first(g: Gpu) -> bool:
        return keep_first_last and g.index == 0

    def set_key(group: list[Gpu]) -> tuple[Any, ...]:
        costs = [_pair_cost(snapshot, a, b) for i, a in enumerate(group) for b in group[i + 1 :]]
        return (
            sum(g.uuid in warned for g in group),
            len({g.name for g in group}),
            sum(is_first(g) for g in group),
            max(costs),
            sum(costs),
            sorted(position[g.uuid] for g in group),
        )

    options = [ranked[:count]]
    for seed in ranked:
        group = [seed]
        rest = [g for g in ranked if g is not seed]
        while len(group) < count:
            best = min(
                rest,
                key=lambda c, group=group: (
                    c.uuid in warned,
                    c.name != seed.name,
                    is_first(c),
                    max(_pair_cost(snapshot, c, g) for g in group),
                    sum(_pair_cost(snapshot, c, g) for g in group),
                    position[c.uuid],
                ),
            )
            group.append(best)
            rest.remove(best)
        options.append(group)
    return min(options, key=set_key)
