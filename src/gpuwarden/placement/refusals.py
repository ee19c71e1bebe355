"""Why GPUs are passed over, in words: the reasons `selection.choose` gives per GPU
and the one-line message when a request can never fit.

Kept apart from the choosing so that `selection` reads as policy (what fits, in
which order) and this module as its explanation; both are pure.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from gpuwarden.base.units import format_size
from gpuwarden.placement.mig import is_mig

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Optional

    from gpuwarden.machine.inventory import Gpu, Snapshot

# Kinds of "never fits" reasons: outside the request's scope, unhealthy or drained,
# or filtered out by the request.
SCOPE, HEALTH, FILTER = "scope", "health", "filter"
BUSY = "busy: "  # the prefix of a reason that another process's compute caused


def machine_ids(snapshot: Snapshot) -> str:
    if not snapshot.gpus:
        return "this machine has no GPUs" + (f" ({snapshot.error})" if snapshot.error else "")
    indices = sorted(g.index for g in snapshot.gpus)
    if indices == list(range(indices[0], indices[-1] + 1)) and len(indices) > 2:
        span = f"{indices[0]}-{indices[-1]}"
    else:
        span = ",".join(map(str, indices))
    return f"this machine has GPUs {span} (or use a UUID prefix)"


def plural(n: int, word: str = "GPU") -> str:
    return f"{n} {word}" + ("" if n == 1 else "s")


def model_matches(name: Optional[str], pattern: str) -> bool:
    if name is None:
        return False
    low, pat = name.lower(), pattern.lower()
    if any(c in pat for c in "*?["):
        import fnmatch  # only for a glob: run without --model never needs it

        return fnmatch.fnmatchcase(low, pat)
    return pat in low


def only(n: int) -> str:
    return "none is" if n == 0 else f"only {n} is" if n == 1 else f"only {n} are"


def pct(value: float) -> str:
    return f"{value:g}%"


def visible_list(snapshot: Snapshot, allowed: set[str]) -> str:
    indices = [str(g.index) for g in snapshot.gpus if g.uuid in allowed]
    return ("GPUs " + ",".join(indices)) if indices else "no GPU"


def never_reason(
    gpu: Gpu,
    request: Any,  # a request.Request (selection imports this module)
    allowed: Optional[set[str]],
    named: Optional[set[str]],
    excluded: set[str],
    out_of_service: Optional[tuple[str, str]],
) -> Optional[tuple[str, str]]:
    if allowed is not None and gpu.uuid not in allowed:
        return SCOPE, "not visible: outside the parent CUDA_VISIBLE_DEVICES"
    if named is not None and gpu.uuid not in named:
        return SCOPE, "not among the requested GPUs"
    if gpu.uuid in excluded:
        return FILTER, "excluded"
    if out_of_service is not None:
        return out_of_service
    want = request.min_capability
    if want is not None:
        have = gpu.compute_capability
        if have is None:
            return FILTER, f"compute capability n/a (asked for {want[0]}.{want[1]})"
        if tuple(have) < tuple(want):
            return FILTER, f"compute capability {have[0]}.{have[1]} < {want[0]}.{want[1]}"
    if request.model is not None and not model_matches(gpu.name, request.model):
        return FILTER, f"model {gpu.name or 'n/a'} does not match {request.model!r}"
    need = max(request.min_free or 0, request.mem or 0)
    if need and gpu.memory_total is not None and gpu.memory_total < need:
        return FILTER, (
            f"only {format_size(gpu.memory_total)} in total < {format_size(need)} asked for"
        )
    return None


def out_of_service(fatal: Sequence[str], drain: Any) -> Optional[tuple[str, str]]:
    """Why a GPU serves no job at all now (HEALTH), whatever the request: `fatal`, its
    fatal health findings (a lost GPU has one), or `drain`, its drain (None: none)."""
    if fatal:
        return HEALTH, "unhealthy: " + "; ".join(fatal)
    if drain is not None:
        return HEALTH, f"drained by {drain.by}: {drain.reason}"
    return None


def busy_reason(
    gpu: Gpu, request: Any, leases: list[Any], lease_pids: set[int], named: bool = False
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
                f"{BUSY}pid {p.pid}{who} uses {format_size(p.used_memory)}{more}",
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
                f"{plural(len(leases), 'shared lease')} + {format_size(others)} used by others"
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
            return f"utilization n/a{why} (asked for at most {pct(request.max_util)})", free
        if gpu.utilization_gpu > request.max_util:
            return f"util {pct(gpu.utilization_gpu)} > {pct(request.max_util)}", free
    return None, free


def some(snapshot: Snapshot, reasons: Mapping[str, str], limit: int = 3) -> str:
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


def never_message(
    snapshot: Snapshot,
    count: int,
    named: Optional[tuple[Gpu, ...]],
    allowed: Optional[set[str]],
    never: Mapping[str, tuple[str, str]],
) -> str:
    asked = f"asked for {plural(count)}"
    if not snapshot.gpus:
        return f"{asked} but {machine_ids(snapshot)}"
    if named is not None and count > len(named):
        return f"{asked} but only {len(named)} {'was' if len(named) == 1 else 'were'} named"
    if allowed is not None:
        visible = sum(1 for g in snapshot.gpus if g.uuid in allowed)
        if count > visible:
            return (
                f"{asked} but the parent CUDA_VISIBLE_DEVICES leaves only {plural(visible)} visible"
            )
    elif count > len(snapshot.gpus):
        return f"{asked} but this machine has only {plural(len(snapshot.gpus))}"
    relevant = {u: kr for u, kr in never.items() if kr[0] != SCOPE}
    usable = len(snapshot.gpus) - len(never)
    kinds = {k for k, _ in relevant.values()}
    phrase = "healthy and not drained" if kinds == {HEALTH} else "suitable for this request"
    reasons = some(snapshot, {u: r for u, (_, r) in relevant.items()})
    return f"{asked} but {only(usable)} {phrase} ({reasons})"
