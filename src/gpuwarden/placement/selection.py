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

from collections.abc import Collection, Iterable, Mapping, Sequence

from gpuwarden.base.errors import UserError
from gpuwarden.base.records import field, record
from gpuwarden.base.units import format_size, is_digits
from gpuwarden.placement.mig import devices, is_mig
from gpuwarden.placement.refusals import (
    BUSY,
    FILTER,
    busy_reason,
    machine_ids,
    never_message,
    never_reason,
    only,
    out_of_service,
    pct,
    plural,
    some,
    visible_list,
)

TYPE_CHECKING = False  # typing stays off the start-up path; annotations need it only here
if TYPE_CHECKING:
    from typing import Any, Optional, Union

    from gpuwarden.machine.inventory import Gpu, Snapshot
    from gpuwarden.placement.request import Request

# Kinds of "can never serve", used to word the never-fits message.
# How a GPU someone else computes on is passed over, and how to accept one anyway.
_BUSY_HINT = "an exclusive lease avoids GPUs others compute on: --max-util or --gpus accepts them"


@record
class Choice:
    """The outcome: chosen GPUs in PCI (nvidia-smi) order, and why every other GPU was
    passed over. `error` is set when fewer than `count` GPUs fit; `never_fits` when
    they never will on this machine, whatever the leases and current load."""

    gpus: tuple[Gpu, ...]
    passed_over: dict[str, str] = field(default_factory=dict)
    error: Optional[str] = None
    never_fits: bool = False
    unfit: frozenset[str] = frozenset()  # the GPUs that can never serve this request here

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
        if is_digits(text):
            matches = [g for g in snapshot.gpus if g.index == int(text)]
        else:
            low = text.lower()
            matches = [
                g
                for g in (*snapshot.gpus, *(u for u in units if is_mig(u)))
                if g.uuid.lower().startswith(low) or g.uuid.lower().startswith("gpu-" + low)
            ]
        if not matches:
            raise UserError(f"unknown GPU {text!r}: {machine_ids(snapshot)}")
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


def _drain_map(drains: Any) -> dict[str, Any]:
    if drains is None:
        return {}
    if isinstance(drains, Mapping):
        return dict(drains)
    return {d.uuid: d for d in drains}


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
    leaves visible (None = all), `health` the `health.Symptom`s by UUID as
    `xidlog.judged` gives them, with the recorded XIDs (None: judged from the
    snapshot alone, a pure call; every command passes the XID-aware one). Bad IDs in
    the request raise UserError; "does not fit" is reported in the Choice, not raised."""
    from gpuwarden.health.judgement import FATAL, WARNING, judge, judge_all

    named = resolve_ids(snapshot, request.gpus, "devices") if request.gpus else None
    excluded = {g.uuid for g in resolve_ids(snapshot, request.exclude, "expand")}
    count = request.count if request.count is not None else (len(named) if named else 1)
    if count < 0:
        raise UserError(f"invalid GPU count {count}: expected 0 or more")
    allowed_set = None if allowed is None else set(allowed)
    # A GPU in MIG mode is chosen by MIG device; health, drains and whole-GPU leases
    # are the parent GPU's.
    parent = {m.uuid: g.uuid for g in snapshot.gpus if g.mig_mode for m in g.mig_instances}
    profile = {m.uuid: (m.name or "").lower() for g in snapshot.gpus for m in g.mig_instances}
    physical = snapshot
    if parent:
        from dataclasses import replace

        snapshot = replace(snapshot, gpus=devices(snapshot))
    if request.mig is not None and request.mig not in profile.values():
        return _no_such_profile(snapshot, request.mig, profile)
    drain_by_uuid = _drain_map(drains)
    leases_on: dict[str, list[Any]] = {}
    for lease in leases:
        leases_on.setdefault(lease.uuid, []).append(lease)
    lease_pids = {lease.pid for lease in leases}
    for g in named or ():  # a GPU named outside the parent's set is a mistake worth naming
        if allowed_set is not None and g.uuid not in allowed_set:
            raise UserError(
                f"GPU {g.index} is not visible here: the parent CUDA_VISIBLE_DEVICES "
                "leaves only " + visible_list(snapshot, allowed_set)
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
        warnings = [f.reason for f in findings if f.level == WARNING]
        if warnings:
            warned[gpu.uuid] = "; ".join(warnings)
        fatal = [f.reason for f in findings if f.level == FATAL]  # as `unusable` judges:
        out = out_of_service(fatal, drain_by_uuid.get(gpu.uuid) or drain_by_uuid.get(own))
        reason = never_reason(gpu, request, allowed_set, named_uuids, excluded, out)
        if not reason and request.mig is not None and profile.get(gpu.uuid) != request.mig:
            got = f"a MIG {profile[gpu.uuid]} slice" if gpu.uuid in profile else "not a MIG slice"
            reason = FILTER, f"{got}, not {request.mig}"
        if not reason and gpu.mig_mode:
            reason = FILTER, "MIG mode is on but it has no MIG device: CUDA cannot use it"
        if not reason and count > 1 and is_mig(gpu):
            reason = FILTER, "MIG device: CUDA shows a process one MIG device only"
        if reason:
            never[gpu.uuid] = reason
            continue
        busy_why, free = busy_reason(
            gpu,
            request,
            leases_on.get(gpu.uuid, []) + (leases_on.get(own, []) if own != gpu.uuid else []),
            lease_pids,
            named_uuids is not None,
        )
        if busy_why:
            busy[gpu.uuid] = busy_why
        else:
            room[gpu.uuid] = free

    candidates = [g for g in snapshot.gpus if g.uuid in room]
    unfit = frozenset(never)
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
        return Choice((), passed, unfit=unfit)
    if len(candidates) < count:
        for g in candidates:
            passed[g.uuid] = f"fits, but fewer than {count} GPUs do"
        if len(snapshot.gpus) - len(never) < count:
            error = never_message(snapshot, count, named, allowed_set, never)
            return Choice((), passed, error, True, unfit)
        return Choice(
            (), passed, _too_few_now(snapshot, count, len(candidates), busy), False, unfit
        )

    chosen = _best_set(snapshot, candidates, count, warned, request.keep_first_last)
    chosen_uuids = {g.uuid for g in chosen}
    for g in candidates:
        if g.uuid not in chosen_uuids:
            passed[g.uuid] = _passed_over(g, warned, room, request.keep_first_last)
    return Choice(tuple(sorted(chosen, key=lambda g: g.index)), passed, unfit=unfit)


def unusable(
    uuid: str, own: str, drains: Mapping[str, Any], findings: Sequence[Any]
) -> Optional[tuple[str, str]]:
    """Why GPU (or MIG slice) `uuid`, of the physical GPU `own`, can serve no job now —
    a fatal health finding of `own` (a lost GPU has one) or a drain of either — or None:
    the one answer to "is this GPU usable" that `choose` and the queue service's plan
    (service.placing) both take."""
    from gpuwarden.health.judgement import FATAL

    fatal = [f.reason for f in findings if f.level == FATAL]
    return out_of_service(fatal, drains.get(uuid) or drains.get(own))


def _too_few_now(snapshot: Snapshot, count: int, fitting: int, busy: Mapping[str, str]) -> str:
    """The refusal of a request that would fit were the busy GPUs free."""
    reasons = some(snapshot, busy)
    error = f"asked for {plural(count)} but {only(fitting)} free now ({reasons})"
    if any(r.startswith(BUSY) for r in busy.values()):
        error += f"; {_BUSY_HINT}"
    return error


def _no_such_profile(snapshot: Snapshot, mig: str, profile: Mapping[str, str]) -> Choice:
    """A MIG profile no slice here has: it can never fit, and what the machine has."""
    have = sorted({p for p in profile.values() if p})
    return Choice(
        (),
        {},
        f"no MIG slice of profile {mig} here: "
        + (f"this machine has {', '.join(have)}" if have else "no GPU here is in MIG mode")
        + " (docs/mig.md)",
        True,
        frozenset(g.uuid for g in snapshot.gpus),
    )


def _passed_over(
    g: Gpu, warned: Mapping[str, str], room: Mapping[str, float], keep_first_last: bool
) -> str:
    """Why a GPU that fits was not among those chosen: the ranking's first reason."""
    if g.uuid in warned:
        return f"ranked after GPUs without health warnings ({warned[g.uuid]})"
    if keep_first_last and g.index == 0:
        return "kept for last (GPU 0 often drives a display)"
    util = "n/a" if g.utilization_gpu is None else pct(g.utilization_gpu)
    return (
        f"not needed: others ranked higher (this one: {format_size(int(room[g.uuid]))} "
        f"free, util {util})"
    )


def fitting(
    snapshot: Snapshot,
    request: Request,
    health: Optional[Mapping[str, Sequence[Any]]] = None,
) -> frozenset[str]:
    """The UUIDs of the GPUs (MIG devices in place of a MIG-mode GPU) that can ever serve
    `request` on this machine, whatever runs on them now: what a queue may wait for.
    Bad IDs in the request raise UserError, as in `choose`."""
    choice = choose(snapshot, request, health=health)
    return frozenset(g.uuid for g in devices(snapshot)) - choice.unfit


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

            def joining_cost(c: Gpu, group: list[Gpu] = group, seed: Gpu = seed) -> tuple[Any, ...]:
                return (
                    c.uuid in warned,
                    c.name != seed.name,
                    is_first(c),
                    max(_pair_cost(snapshot, c, g) for g in group),
                    sum(_pair_cost(snapshot, c, g) for g in group),
                    position[c.uuid],
                )

            best = min(rest, key=joining_cost)
            group.append(best)
            rest.remove(best)
        options.append(group)
    return min(options, key=set_key)
