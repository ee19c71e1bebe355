"""The queue as the service knows it between two passes of its plan, in one object.

The jobs themselves and their states are the journal's (service.store; a state moves
only by service.states' table). What a pass of the plan worked out is kept here, by
the pass (`schedule` in service.passes hands its outcome to `planned`) and read by
the requests between passes: `free` judges whether a new submit may start at once
(service.pacing), `priorities` orders `queue`, `expected_start` answers
`queue --start`, `memory` and `indices` name the GPUs jobs are given. The state is
written in one place, with explicit inputs, so no concern sets a figure another reads
by a side door.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import NamedTuple, Optional, Protocol

from gpuwarden.planning import scheduling


class Unit(Protocol):
    """A GPU or MIG slice of a snapshot, as jobs are given them (mig.devices)."""

    @property
    def uuid(self) -> str: ...
    @property
    def index(self) -> int: ...
    @property
    def memory_total(self) -> Optional[int]: ...


class Foresight(NamedTuple):
    """A full pass's inputs and decisions: every waiting job's expected start follows
    from them (`foresight.estimated_starts`), worked out only when a listing asks."""

    gpus: Sequence[scheduling.QueueGpu]
    running: Sequence[scheduling.Running]
    waiting: Mapping[str, scheduling.Waiting]
    decisions: Sequence[scheduling.Decision]
    now: float


class QueueState:
    def __init__(self) -> None:
        self.free: Optional[scheduling.Capacity] = None  # what the last pass left free
        self.priorities: dict[int, float] = {}  # waiting job id -> its priority, last pass
        self.estimates: dict[int, Optional[float]] = {}  # job id -> the plan's expected start
        self.foresight: Optional[Foresight] = None  # the last full pass (`expected_start`)
        self.foreseen: Optional[dict[int, Optional[float]]] = None  # worked out from it
        self.memory: dict[str, int] = {}  # GPU memory by UUID, from the last snapshot
        self.indices: dict[str, int] = {}  # nvidia-smi index by UUID, likewise

    def seen(self, units: Iterable[Unit]) -> None:
        """The GPUs (MIG slices in place of their GPU) as the last snapshot shows them."""
        units = list(units)
        self.memory = {g.uuid: g.memory_total or 0 for g in units}
        self.indices = {g.uuid: g.index for g in units}

    def gpu_memory(self, gpus: Iterable[str]) -> int:
        """The largest memory of the GPUs `gpus` (UUIDs): what a job's usage is scaled by."""
        return max((self.memory.get(u, 0) for u in gpus), default=0)

    def nothing_waits(self, full: bool) -> None:
        """A pass found no job to plan: after a full one, what is free is not known (a
        submit then plans at once)."""
        if full:
            self.free = None

    def planned(
        self,
        full: bool,
        gpus: Sequence[scheduling.QueueGpu],
        busy: Sequence[scheduling.Running],
        waiting: Sequence[scheduling.Waiting],
        decisions: Sequence[scheduling.Decision],
        now: float,
        mem: Mapping[int, Optional[int]],
    ) -> None:
        """A pass's outcome: priorities and expected starts (a start pass adds to the last
        full pass's), and what is left free once the running jobs and the starts have
        theirs (`mem`: each planned job's declared memory, by id)."""
        if full:
            self.priorities = {int(d.id): d.priority for d in decisions}
            self.estimates = {int(d.id): d.estimated_start for d in decisions}
            # Every waiting job's expected start (`queue --start`), worked out when a
            # listing first asks for it after this pass: the plan itself needs none.
            self.foresight = Foresight(gpus, busy, {w.id: w for w in waiting}, decisions, now)
            self.foreseen = None
        else:
            self.priorities.update((int(d.id), d.priority) for d in decisions)
            self.estimates.update((int(d.id), d.estimated_start) for d in decisions)
        self.free = free = scheduling.Capacity(gpus)
        for run in busy:
            free.take(run.gpus, run.mem)
        for decision in decisions:
            if decision.starts:
                free.take(decision.gpus, mem[int(decision.id)])

    def expected_start(self, job_id: int) -> Optional[float]:
        """When a waiting job should start (`squeue --start`): the plan's reservation,
        else foresight over the last full pass, worked out once per pass."""
        planned = self.estimates.get(job_id)
        if planned is not None or self.foresight is None:
            return planned
        if self.foreseen is None:
            from gpuwarden.planning.foresight import estimated_starts

            starts = estimated_starts(*self.foresight)
            self.foreseen = {int(k): v for k, v in starts.items()}
        return self.foreseen.get(job_id)
