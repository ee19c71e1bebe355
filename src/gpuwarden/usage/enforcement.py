"""Enforcement policies on a shared server, as pure functions over what was seen.

Three things go wrong daily on a lab server: a job that declared `--mem 10GiB`
takes 40 and its neighbour on the card dies of OOM; someone runs plain
`python train.py` on a GPU the queue just gave to someone else; a reservation
holds a GPU idle for days. Each is judged here from a reading (NVML's
per-process memory, the leases, utilization) and a little state carried from
the previous reading, and turned into an action:

- memory over-use: a shared (`--mem`) job using more than its declaration plus
  `enforce.memory_tolerance` percent is warned at once and, still over after
  `enforce.memory_grace`, handled per `enforce.memory_action` (notify | kill).
  A job within its declaration is never touched, whatever the settings.
- unleased use: a GPU process that belongs to no lease on that GPU is reported
  with its user at once; after `enforce.unleased_grace`, and only when the GPU
  is leased to someone else and `enforce.unleased_action = kill`, it is killed.
- idle leases: a lease whose GPUs show 0% utilization and no change in memory
  for `enforce.idle_after` is reported, or released (`enforce.idle_action`).

The defaults notify and never kill. Who a process belongs to comes from the
kernel (its ancestry in /proc, the owner of the lease file), never from a
name written in a file. The watcher (`gpuwarden.monitoring.enforcer`) reads the machine,
calls these functions, and carries out and logs what they return.
"""

from __future__ import annotations

from gpuwarden.base.records import field, record

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterable, Sequence
    from typing import Any, Optional


@record
class EnforceSettings:
    """The `[enforce]` settings the policies use (see gpuwarden.config)."""

    memory_tolerance: float = 10.0  # percent over the declaration
    memory_grace: float = 60.0
    memory_action: str = "notify"  # notify | kill
    unleased_grace: float = 300.0
    unleased_action: str = "notify"  # notify | kill
    idle_after: float = 86400.0
    idle_action: str = "report"  # report | release

    @classmethod
    def from_config(cls, conf: Any) -> EnforceSettings:
        return cls(**{name: conf.get(f"enforce.{name}") for name in cls.__dataclass_fields__})


@record
class Since:
    """A condition seen since `since`; `expired` once its grace has run out (acted on)."""

    since: float
    expired: bool = False


def track(
    bad: bool, state: Optional[Since], now: float, grace: float
) -> tuple[Optional[Since], Optional[str]]:
    """One reading of a condition: (the new state, the event).

    The event is "start" the first time the condition is seen, "expired" once, when it has
    lasted `grace` seconds, and None otherwise; the condition going away forgets it, so a
    job that dips back under its limit starts a fresh grace."""
    if not bad:
        return None, None
    if state is None:
        if grace <= 0:
            return Since(now, True), "expired"
        return Since(now), "start"
    if not state.expired and now - state.since >= grace:
        return Since(state.since, True), "expired"
    return state, None


# --- declared memory ----------------------------------------------------------------------------


def memory_limit(declared: int, tolerance: float) -> int:
    """The most a job that declared `declared` bytes may use before it is over."""
    return declared + int(declared * max(tolerance, 0.0) / 100)


def over_memory(declared: Optional[int], used: Optional[int], tolerance: float) -> bool:
    """Whether a job uses clearly more than it declared. An exclusive job (no
    declaration) and a reading NVML could not give are never over."""
    if declared is None or used is None:
        return False
    return used > memory_limit(declared, tolerance)


def memory_action(
    declared: Optional[int],
    used: Optional[int],
    state: Optional[Since],
    now: float,
    policy: EnforceSettings,
) -> tuple[Optional[Since], Optional[str]]:
    """(new state, action): "warn" when first over, then once the grace is over
    `policy.memory_action` ("notify" or "kill"); None while nothing is to be done."""
    bad = over_memory(declared, used, policy.memory_tolerance)
    state, event = track(bad, state, now, policy.memory_grace)
    if event == "start":
        return state, "warn"
    if event == "expired":
        return state, policy.memory_action
    return state, None


# --- unleased use -------------------------------------------------------------------------------


@record
class Lease:
    """A lease as the policies need it: the GPU, the holder's pid and its owner (the lease
    file's owner, from the kernel)."""

    gpu: str  # UUID
    pid: Optional[int]
    owner: Optional[str]
    job: Optional[str] = None
    shared: bool = False
    mem: Optional[int] = None


@record
class Use:
    """A process NVML sees on a GPU, with its ancestry from /proc (itself first)."""

    pid: int
    gpu: str  # UUID
    user: Optional[str]
    memory: Optional[int] = None
    lineage: tuple[int, ...] = field(default=())
    # The `gpuwarden.lease` label of the container it runs in (ancestry.container_job):
    # "" in a container gpuwarden did not start, None in none.
    container: Optional[str] = None


@record
class Unleased:
    """A process using a GPU outside every lease on it."""

    pid: int
    gpu: str
    user: Optional[str]
    leased_to: Optional[str]  # the owner of a lease on that GPU held by someone else
    container: Optional[str] = None  # as `Use.container`


def lease_of(use: Use, leases: Iterable[Lease]) -> Optional[Lease]:
    """The lease on the process's GPU whose holder is the process or one of its ancestors,
    or whose job its container is labelled with (a container is the child of its runtime,
    not of the job that started it). The label is anyone's to write, so it counts for a
    lease of the process's own user, or for a process run as root: a rootful runtime,
    which only root and its equivalents drive."""
    lineage = set(use.lineage) | {use.pid}
    for lease in leases:
        if lease.gpu != use.gpu:
            continue
        if lease.pid is not None and lease.pid in lineage:
            return lease
        if use.container and use.container == lease.job and use.user in ("root", lease.owner):
            return lease
    return None


def owner(use: Use, lease: Optional[Lease]) -> Optional[str]:
    """Whom a process's use counts for: the lease's owner for a process of a container
    started under it (its own user there is often root), else its own user."""
    return lease.owner if lease is not None and use.container else use.user


def unleased(uses: Iterable[Use], leases: Sequence[Lease]) -> list[Unleased]:
    """Every use that belongs to no lease on its GPU; `leased_to` names the lease's owner
    when the GPU is leased to someone other than the process's user."""
    found = []
    for use in uses:
        if lease_of(use, leases) is not None:
            continue
        others = sorted(
            {
                other.owner or "?"
                for other in leases
                if other.gpu == use.gpu and other.owner != use.user
            }
        )
        leased_to = ", ".join(others) or None
        found.append(Unleased(use.pid, use.gpu, use.user, leased_to, use.container))
    return found


def unleased_action(
    finding: Unleased, state: Optional[Since], now: float, policy: EnforceSettings
) -> tuple[Optional[Since], Optional[str]]:
    """(new state, action) for a process seen in use without a lease: "notify" at once;
    "kill" after the grace only under the kill policy on a GPU leased to someone else."""
    first = state is None
    state, event = track(True, state, now, policy.unleased_grace)
    if event == "expired" and policy.unleased_action == "kill" and finding.leased_to is not None:
        return state, "kill"
    return state, ("notify" if first else None)


# --- idle leases --------------------------------------------------------------------------------


@record
class Idle:
    """What the last reading of a lease's GPU showed: since when idle, its memory, and its
    time when it was at 0% (an idle stretch counts from the first quiet reading)."""

    since: Optional[Since]
    memory: Optional[int]
    quiet_at: Optional[float] = None


def idle_action(
    util: Optional[int],
    memory: Optional[int],
    last: Optional[Idle],
    now: float,
    policy: EnforceSettings,
) -> tuple[Idle, Optional[str]]:
    """(new state, action) for one lease: idle means 0% utilization and the same memory as
    at the previous reading, itself at 0%; after `policy.idle_after` of it, "report" or
    "release" once. Any activity starts the count again; an unknown reading is never idle."""
    quiet = util == 0 and memory is not None
    bad = quiet and last is not None and last.quiet_at is not None and last.memory == memory
    previous = None
    if bad and last is not None:
        previous = last.since or Since(last.quiet_at)  # type: ignore[arg-type]
    state, event = track(bad, previous, now, policy.idle_after)
    quiet_at = (last.quiet_at if bad and last is not None else now) if quiet else None
    return Idle(state, memory, quiet_at), (policy.idle_action if event == "expired" else None)
