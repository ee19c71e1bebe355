"""What a pass of the plan leaves for the requests between passes (service.queuestate),
written by the pass alone through `planned` and read as the service's requests read it."""

from __future__ import annotations

from typing import NamedTuple, Optional

from gpuwarden.planning.foresight import estimated_starts
from gpuwarden.planning.scheduling import Decision, QueueGpu, Running, Waiting
from gpuwarden.service.queuestate import QueueState

GB = 1 << 30
GPUS = [QueueGpu("A", 80 * GB), QueueGpu("B", 80 * GB), QueueGpu("C", 80 * GB)]


class Unit(NamedTuple):
    uuid: str
    index: int
    memory_total: Optional[int]


def test_a_full_pass_sets_the_figures_and_a_start_pass_adds_to_them() -> None:
    queue = QueueState()
    busy = [Running("1", "a", ("A",), 0.0, time_limit=100.0)]
    waiting = [Waiting("2", "b", 1, 5.0), Waiting("3", "b", 2, 6.0, mem=GB)]
    decisions = [Decision("2", 9.0, gpus=("B",)), Decision("3", 8.0, reason="Resources")]
    queue.planned(True, GPUS, busy, waiting, decisions, 50.0, {2: None, 3: GB})
    assert queue.priorities == {2: 9.0, 3: 8.0} and queue.estimates == {2: None, 3: None}
    assert queue.free is not None and queue.free.idle == 1  # C: A runs, B starts
    assert not queue.free.could_fit(2, None) and queue.free.could_fit(1, GB)
    # Job 3 holds no reservation: its start is foreseen from the pass, once.
    foreseen = estimated_starts(GPUS, busy, {w.id: w for w in waiting}, decisions, 50.0)
    assert queue.expected_start(3) == foreseen["3"] == 100.0
    assert queue.foreseen is not None
    queue.planned(False, GPUS, busy, waiting[:1], [Decision("2", 9.5, reason="x")], 60.0, {})
    assert queue.priorities == {2: 9.5, 3: 8.0}  # a start pass adds to the full pass's
    assert queue.foreseen is not None  # and keeps its foresight
    assert queue.free.idle == 2  # nothing starts: B and C are free
    queue.nothing_waits(full=False)
    assert queue.free is not None  # a start pass with nothing to plan leaves it
    queue.nothing_waits(full=True)
    assert queue.free is None  # not known after a full one: a submit plans at once


def test_the_gpus_as_last_seen_name_and_scale_a_jobs_gpus() -> None:
    queue = QueueState()
    queue.seen([Unit("A", 0, 80 * GB), Unit("B", 3, None)])
    assert queue.indices == {"A": 0, "B": 3} and queue.memory == {"A": 80 * GB, "B": 0}
    assert queue.gpu_memory(("B", "A", "gone")) == 80 * GB
    assert queue.gpu_memory(()) == 0
