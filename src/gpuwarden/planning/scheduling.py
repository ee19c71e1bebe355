"""Which waiting jobs start now, and why each other one waits — pure functions.

The queue service calls `plan()` after every event (a submit, a job's end, a
drain, a limit change) with what it knows: the GPUs, the running jobs, the
waiting ones, each user's decayed usage. `plan()` reads no file, clock or NVML,
so the whole policy is tested on hand-built queues (tests/test_scheduling*.py
fuzz its invariants). docs/service.md explains it to users with a worked example.

Priority is Slurm's multifactor sum, each weight configurable:

    priority = w_fairshare * 2^(-U/S) + w_age * min(age / age_max, 1)
             + w_qos * qos + w_nice * (-nice / 20)

where U is the user's share of all decayed usage and S the user's share of all
configured shares (Slurm's classic fair-share factor). Usage is GPU-seconds,
a shared (`--mem`) job counting the fraction of the card it declared, decayed
with a half-life (7 days by default, as Slurm's PriorityDecayHalfLife). With
account shares, the factor has an account level too (gpuwarden.planning.fairshare), and an
account's `max_gpus` caps the GPUs its jobs hold together, as a user's does theirs.

Starting is EASY backfill: jobs are taken in priority order and start while
they fit; the first that does not fit gets a reservation at the earliest time
the running jobs' time limits free enough GPUs, and a later job may still start
now only if it cannot delay that reservation (it ends before it, or leaves the
reserved job enough room). A job without `--time` is assumed to run forever,
so it is never backfilled in front of a reservation, only onto GPUs the
reservation does not need — except while the reserved job is young: when its
start cannot be estimated (the running jobs declared no `--time`), holding GPUs
idle for it could last forever, so for its first `policy.starve_after` seconds
(an hour by default) later jobs that fit still start; after that the GPUs it
needs are kept for it as they free up.

`plan()` decides *who* starts and how many GPUs each gets; *which* of the free GPUs
is the machine's one placement policy (`gpuwarden.placement.selection`: health, topology, MIG
slices, sharing), which the service hands in as `pick` so a queued job gets the GPUs
`run` would choose. Without `pick`, free GPUs are taken in order.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple, Optional

from gpuwarden.planning import booking
from gpuwarden.planning.fairshare import decayed as decayed
from gpuwarden.planning.fairshare import fairshare_factor as fairshare_factor
from gpuwarden.planning.fairshare import fairshare_factors as fairshare_factors
from gpuwarden.planning.fairshare import job_factors
from gpuwarden.planning.fairshare import job_usage as job_usage

# Why a job waits, as squeue's REASON column words it (docs/service.md lists them).
RESOURCES = "Resources"  # not enough free GPUs now (or it holds the reservation)
PRIORITY = "Priority"  # it would fit, but starting it could delay a job ahead of it
HELD = "Held"
DEPENDENCY = "Dependency"  # waits for `--after` jobs to end
DEPENDENCY_FAILED = "DependencyNeverSatisfied"  # an `--after` job failed or was cancelled
USER_GPU_LIMIT = "UserGpuLimit"  # the owner already uses as many GPUs as allowed
ACCOUNT_GPU_LIMIT = "AccountGpuLimit"  # its account's jobs already use as many as allowed
DRAINED = "Drained"  # every GPU it could use is drained or unhealthy
BEGIN_TIME = "BeginTime"  # its --begin time has not come
BOOKED = "Booked"  # the GPUs it could get now are booked for others (gpuwarden.planning.booking)

NICE_RANGE = (-20, 19)


@dataclass(frozen=True)
class Policy:
    """Weights, decay and limits; `gpuwarden config` shows where each came from."""

    weight_fairshare: float = 10_000.0
    weight_age: float = 1_000.0
    weight_qos: float = 10_000.0
    weight_nice: float = 1_000.0
    age_max: float = 7 * 86400.0  # age factor reaches 1 after this long
    half_life: float = 7 * 86400.0  # usage halves in this time
    shares: Mapping[str, float] = field(default_factory=dict)  # user -> share; others 1
    default_share: float = 1.0
    max_gpus_per_user: Optional[int] = None  # GPUs in use at once
    gpu_caps: Mapping[str, int] = field(default_factory=dict)  # per user, over the above
    exempt: frozenset[str] = frozenset()  # users the limits do not bind (admins)
    # Accounts (gpuwarden.planning.fairshare): their shares (none: fair share is per user only),
    # the GPUs each account's jobs may use at once, and, filled in for each pass by the
    # service, the decayed usage charged to each (account, user); "" for no account.
    account_shares: Mapping[str, float] = field(default_factory=dict)
    account_caps: Mapping[str, int] = field(default_factory=dict)
    account_usage: Mapping[tuple[str, str], float] = field(default_factory=dict)
    starve_after: float = 3600.0  # see the module docstring: when GPUs are kept idle

    def share(self, user: str) -> float:
        return float(self.shares.get(user, self.default_share))


# The records a plan reads and writes are NamedTuples: a pass builds and reads a few
# thousand of them, and a tuple is made and read several times faster than a frozen
# dataclass (bench/scheduling.py).


class QueueGpu(NamedTuple):
    """A GPU the queue may hand out. `memory` (bytes) bounds the shared (`--mem`)
    jobs packed onto it; `usable` is False when it is drained or unhealthy."""

    uuid: str
    memory: int
    usable: bool = True


class Running(NamedTuple):
    """A job holding GPUs. `mem` None: it holds them whole."""

    id: str
    user: str
    gpus: tuple[str, ...]
    started: float
    mem: Optional[int] = None
    time_limit: Optional[float] = None  # seconds; None: no limit declared
    preemptible: bool = False  # it yields its GPUs when needed (gpuwarden.planning.preemption)
    leaving: bool = False  # it was told to end (preempted, cancelled, past its limit)
    account: Optional[str] = None  # --account: its GPUs count against the account's cap

    @property
    def ends(self) -> float:
        """When the queue may count on its GPUs: its time limit, or never."""
        return math.inf if self.time_limit is None else self.started + self.time_limit


class Waiting(NamedTuple):
    """A job in the queue. `eligible` limits the GPUs it may get (its filters, a parent
    CUDA_VISIBLE_DEVICES); None means any usable GPU. `after`: ids it depends on."""

    id: str
    user: str
    count: int  # type: ignore[assignment]  # GPUs; shadows tuple.count, never called here
    submitted: float
    mem: Optional[int] = None
    time_limit: Optional[float] = None
    nice: int = 0
    qos: float = 0.0  # admin-set, 0..1
    held: bool = False
    after: tuple[str, ...] = ()
    eligible: Optional[frozenset[str]] = None
    begin: Optional[float] = None  # --begin: not before this moment
    preemptible: bool = False  # planned by gpuwarden.planning.preemption, after every other job
    account: Optional[str] = None  # --account: fair share's account level, its GPU cap


# Which `count` of the GPUs that are free for a job it gets (None: none of them do);
# the GPUs come in the order the plan would take them.
Pick = Callable[["Waiting", Sequence[str]], Optional[Sequence[str]]]


class Decision(NamedTuple):
    """What `plan` decided for one waiting job: start it on `gpus`, or why it waits."""

    id: str
    priority: float
    gpus: tuple[str, ...] = ()
    reason: Optional[str] = None  # None when it starts
    estimated_start: Optional[float] = None  # for the job holding the reservation

    @property
    def starts(self) -> bool:
        return self.reason is None


# --- priority ----------------------------------------------------------------


def priority(job: Waiting, now: float, fairshare: float, policy: Policy) -> float:
    """The multifactor priority of `job` at `now` (higher starts first), given its
    owner's fair-share factor."""
    waited = now - job.submitted
    if policy.age_max <= 0 or waited >= policy.age_max:
        age = 1.0
    else:
        age = waited / policy.age_max if waited > 0 else 0.0
    nice = job.nice if NICE_RANGE[0] <= job.nice <= NICE_RANGE[1] else NICE_RANGE[job.nice > 0]
    qos = job.qos if 0.0 <= job.qos <= 1.0 else float(job.qos > 1.0)
    return (
        policy.weight_fairshare * fairshare
        + policy.weight_age * age
        + policy.weight_qos * qos
        + policy.weight_nice * (-nice / 20.0)
    )


# --- capacity ------------------------------------------------------------------


class Capacity:
    """Per GPU: taken whole, or how much memory shared jobs declared on it. The
    service keeps the one its last pass left, to tell whether a new job could
    start before planning again (service.pacing)."""

    def __init__(self, gpus: Iterable[QueueGpu]) -> None:
        self.order = [g.uuid for g in gpus if g.usable]
        self.rank = {u: i for i, u in enumerate(self.order)}
        self.most: dict[tuple[Optional[frozenset[str]], Optional[int]], int] = {}
        self.memory = {g.uuid: g.memory for g in gpus if g.usable}
        self.whole: dict[str, int] = dict.fromkeys(self.order, 0)
        self.declared: dict[str, int] = dict.fromkeys(self.order, 0)
        self.shared: dict[str, int] = dict.fromkeys(self.order, 0)
        self.idle = len(self.order)  # GPUs nobody holds: a long queue mostly finds none

    def copy(self) -> Capacity:
        other = Capacity(())
        other.order = self.order
        other.rank = self.rank
        other.most = self.most
        other.memory = self.memory
        other.whole = dict(self.whole)
        other.declared = dict(self.declared)
        other.shared = dict(self.shared)
        other.idle = self.idle
        return other

    def take(self, gpus: Sequence[str], mem: Optional[int], sign: int = 1) -> None:
        for uuid in gpus:
            if uuid not in self.whole:
                continue  # a GPU drained under a running job: nothing to hand out anyway
            was_idle = self.whole[uuid] == 0 and self.shared[uuid] == 0
            if mem is None:
                self.whole[uuid] += sign
            else:
                self.declared[uuid] += sign * mem
                self.shared[uuid] += sign
            self.idle += (self.whole[uuid] == 0 and self.shared[uuid] == 0) - was_idle

    def place(
        self, job: Waiting, avoid: frozenset[str] = frozenset(), pick: Optional[Pick] = None
    ) -> Optional[tuple[str, ...]]:
        """GPUs for `job` now, or None. Whole jobs take free GPUs in the given order;
        shared jobs go where most is already declared (best fit), keeping whole GPUs
        free for whole jobs. GPUs in `avoid` (what a reserved job will need) come last.
        With `pick`, it chooses among the free GPUs, those outside `avoid` first."""
        if job.mem is None and self.idle < job.count:
            return None  # the common case deep in a long queue: nothing is free
        allowed = self.order
        if job.eligible is not None:
            allowed = [u for u in allowed if u in job.eligible]
        if job.mem is None:
            fits = [u for u in allowed if self.whole[u] == 0 and self.shared[u] == 0]
            fits.sort(key=lambda u: (u in avoid, self.rank[u]))
        else:
            fits = [
                u
                for u in allowed
                if self.whole[u] == 0 and self.memory[u] - self.declared[u] >= job.mem
            ]
            fits.sort(key=lambda u: (u in avoid, -self.declared[u], self.rank[u]))
        if len(fits) < job.count:
            return None
        if pick is not None:
            spare = [u for u in fits if u not in avoid]
            got = pick(job, spare) if len(spare) >= job.count else None
            if got is None and len(spare) < len(fits):
                got = pick(job, fits)
            if got is None or len(got) != job.count or not set(got) <= set(fits):
                return None
            fits = list(got)
        return tuple(sorted(fits[: job.count], key=self.rank.__getitem__))

    def could_fit(self, count: int, mem: Optional[int]) -> bool:
        """Whether `count` GPUs (whole, or with `mem` bytes each) are free now on some
        GPUs, whatever a job's filters: False means such a job cannot start yet."""
        if mem is None:
            return self.idle >= count
        room = sum(
            1 for u in self.order if self.whole[u] == 0 and self.memory[u] - self.declared[u] >= mem
        )
        return room >= count

    def can_ever_place(self, job: Waiting) -> bool:
        """Whether the machine could hold `job` if every job ended (cached per shape:
        a long queue is mostly jobs of a few shapes)."""
        key = (job.eligible, job.mem)
        most = self.most.get(key)
        if most is None:
            most = sum(
                1
                for u in self.order
                if (job.eligible is None or u in job.eligible)
                and (job.mem is None or self.memory[u] >= job.mem)
            )
            self.most[key] = most
        return most >= job.count


# --- the plan ------------------------------------------------------------------


def plan(
    gpus: Sequence[QueueGpu],
    running: Sequence[Running],
    waiting: Sequence[Waiting],
    usage: Mapping[str, float],
    now: float,
    policy: Optional[Policy] = None,
    finished: Optional[Mapping[str, bool]] = None,
    pick: Optional[Pick] = None,
    bookings: Sequence[booking.Booking] = (),
) -> list[Decision]:
    """One decision per waiting job, highest priority first.

    `finished` maps the ids of ended jobs to whether they succeeded, for `--after`:
    a dependency on a job that is neither running, waiting nor finished (unknown) is
    treated as satisfied, as Slurm does once a job is purged from its records.
    `pick` chooses which free GPUs a starting job gets (see `Pick`). `bookings` are
    GPUs booked ahead, which jobs of others leave free (gpuwarden.planning.booking).
    """
    policy = Policy() if policy is None else policy
    finished = {} if finished is None else finished
    free = Capacity(gpus)
    in_use: dict[str, int] = {}
    by_account: dict[str, int] = {}  # GPUs each capped account's jobs hold
    for run in running:
        free.take(run.gpus, run.mem)
        if not run.preemptible:  # a preemptible job counts against no limit
            in_use[run.user] = in_use.get(run.user, 0) + len(run.gpus)
            if run.account is not None and run.account in policy.account_caps:
                by_account[run.account] = by_account.get(run.account, 0) + len(run.gpus)
    pending_ids = {w.id for w in waiting}
    running_ids = {r.id for r in running}

    factors = job_factors({(w.user, w.account) for w in waiting}, usage, policy)
    ranked = sorted(
        ((priority(w, now, factors[(w.user, w.account)], policy), w) for w in waiting),
        key=lambda pw: (-pw[0], pw[1].submitted, len(pw[1].id), pw[1].id),  # 9 before 10
    )
    decisions: list[Decision] = []
    shadow: Optional[float] = None  # when the reserved job can start
    reserved: Optional[Waiting] = None
    keep: frozenset[str] = frozenset()  # the GPUs it will get then
    # Preemptible jobs hold nothing a booking needs: its window takes their GPUs back.
    holders = (
        [booking.Holder(r.user, r.gpus, r.ends) for r in running if not r.preemptible]
        if bookings
        else []
    )
    for prio, job in ranked:
        if job.begin is not None and job.begin > now and not job.held:
            reason: Optional[str] = BEGIN_TIME  # said first: nothing else matters before it
        else:
            reason = blocked(
                job, pending_ids, running_ids, finished, free, in_use, policy, by_account
            )
        if reason is not None:
            decisions.append(Decision(job.id, prio, reason=reason))
            continue
        chosen = free.place(job, keep, pick)
        ends = booking.ends_of(now, job.time_limit)
        if chosen is not None and bookings:
            usable = len(free.order)
            if booking.blocking(job.user, ends, chosen, now, bookings, usable, holders):
                decisions.append(Decision(job.id, prio, reason=BOOKED))
                continue
        if chosen is not None and (
            reserved is None
            or _leaves_room(job, chosen, now, shadow, reserved, free, running, policy)
        ):
            free.take(chosen, job.mem)
            in_use[job.user] = in_use.get(job.user, 0) + len(chosen)
            if job.account is not None and job.account in policy.account_caps:
                by_account[job.account] = by_account.get(job.account, 0) + len(chosen)
            if bookings:
                holders.append(booking.Holder(job.user, chosen, ends))
            decisions.append(Decision(job.id, prio, gpus=chosen))
            continue
        if reserved is None:
            reserved, shadow = job, _earliest_start(job, free, running, now)
            keep = _kept_for(job, free, running, shadow)
            estimate = None if shadow is None or math.isinf(shadow) else shadow
            decisions.append(Decision(job.id, prio, reason=RESOURCES, estimated_start=estimate))
            continue
        decisions.append(Decision(job.id, prio, reason=PRIORITY if chosen else RESOURCES))
    return decisions


def blocked(
    job: Waiting,
    pending: set[str],
    running: set[str],
    finished: Mapping[str, bool],
    free: Capacity,
    in_use: Mapping[str, int],
    policy: Policy,
    by_account: Optional[Mapping[str, int]] = None,
) -> Optional[str]:
    """Why `job` cannot start whatever the GPUs do, or None. `in_use`: GPUs each user's
    jobs hold; `by_account`: each capped account's (an exempt user's jobs count there
    but are not held back)."""
    if job.held:
        return HELD
    for dep in job.after:
        if dep in finished and not finished[dep]:
            return DEPENDENCY_FAILED
        if dep in pending or dep in running:
            return DEPENDENCY
    limit = policy.gpu_caps.get(job.user, policy.max_gpus_per_user)
    if (
        limit is not None
        and job.user not in policy.exempt
        and in_use.get(job.user, 0) + job.count > limit
    ):
        return USER_GPU_LIMIT
    cap = policy.account_caps.get(job.account) if job.account is not None else None
    if (
        cap is not None
        and job.user not in policy.exempt
        and (by_account or {}).get(job.account or "", 0) + job.count > cap
    ):
        return ACCOUNT_GPU_LIMIT
    if not free.can_ever_place(job):
        return DRAINED
    return None


def _earliest_start(
    job: Waiting, free: Capacity, running: Sequence[Running], now: float
) -> Optional[float]:
    """When enough running jobs will have ended (by their time limits) for `job` to fit;
    inf when that depends on a job without a time limit."""
    state = free.copy()
    for other in sorted(running, key=lambda r: r.ends):
        if math.isinf(other.ends):
            return math.inf
        state.take(other.gpus, other.mem, -1)
        if state.place(job) is not None:
            return max(now, other.ends)
    return math.inf


def _kept_for(
    job: Waiting, free: Capacity, running: Sequence[Running], shadow: Optional[float]
) -> frozenset[str]:
    """The GPUs `job` would get at `shadow`; backfilled jobs go elsewhere first."""
    if shadow is None or math.isinf(shadow):
        return frozenset(free.order if job.eligible is None else job.eligible)
    state = free.copy()
    for other in running:
        if other.ends <= shadow:
            state.take(other.gpus, other.mem, -1)
    return frozenset(state.place(job) or ())


def _leaves_room(
    job: Waiting,
    chosen: tuple[str, ...],
    now: float,
    shadow: Optional[float],
    reserved: Waiting,
    free: Capacity,
    running: Sequence[Running],
    policy: Policy,
) -> bool:
    """Whether starting `job` on `chosen` now cannot delay `reserved`'s start at `shadow`."""
    if shadow is None or math.isinf(shadow):
        # Nobody can say when the reserved job starts: GPUs it can never use are fair
        # game, and the rest too while it is young (see the module docstring).
        if reserved.eligible is not None and not set(chosen) & reserved.eligible:
            return True
        return now - reserved.submitted < policy.starve_after
    if job.time_limit is not None and now + job.time_limit <= shadow:
        return True
    # It outlives the reservation: fine only if the reserved job still fits at `shadow`
    # with this job's GPUs taken.
    state = free.copy()
    for other in running:
        if other.ends <= shadow:
            state.take(other.gpus, other.mem, -1)
    state.take(chosen, job.mem)
    return state.place(reserved) is not None


# --- time limits ---------------------------------------------------------------

TERM, KILL = "TERM", "KILL"


def overdue(running: Iterable[Running], now: float, grace: float = 30.0) -> list[tuple[str, str]]:
    """(job id, TERM or KILL) for jobs past their time limit: SIGTERM first (the
    gpuwarden.torch Checkpointer saves on it), SIGKILL once `grace` has passed too."""
    actions = []
    for job in running:
        if job.time_limit is None:
            continue
        over = now - job.ends
        if over >= grace:
            actions.append((job.id, KILL))
        elif over >= 0:
            actions.append((job.id, TERM))
    return actions
