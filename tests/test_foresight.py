"""Expected starts for every waiting job (issue 23: `queue --start` as `squeue --start`),
on the plan's own decisions."""

from __future__ import annotations

from gpuwarden.planning import scheduling
from gpuwarden.planning.foresight import estimated_starts
from gpuwarden.planning.scheduling import QueueGpu, Running, Waiting

NOW = 1000.0
GIB = 1 << 30


def starts(
    gpus: list[QueueGpu], running: list[Running], waiting: list[Waiting]
) -> dict[str, object]:
    decisions = scheduling.plan(gpus, running, waiting, {}, NOW)
    return estimated_starts(gpus, running, {w.id: w for w in waiting}, decisions, NOW)


def test_every_waiting_job_gets_a_start_and_unknowable_ones_none() -> None:
    gpus = [QueueGpu("a", 80 * GIB), QueueGpu("b", 80 * GIB)]
    running = [Running("1", "x", ("a", "b"), NOW - 10, None, 110.0)]  # ends at NOW + 100
    waiting = [
        Waiting("2", "u", 2, NOW - 50, time_limit=50.0),  # after job 1: at +100
        Waiting("3", "u", 1, NOW - 40, time_limit=30.0),  # after job 2: at +150
        Waiting("4", "u", 2, NOW - 30),  # no --time: after job 3, at +180, for ever
        Waiting("5", "u", 1, NOW - 20, time_limit=10.0),  # beside job 3, done before 4
        Waiting("6", "u", 1, NOW - 10, time_limit=30.0),  # too long for the gap: unknown
        Waiting("7", "u", 1, NOW - 5, time_limit=10.0, held=True),  # held: nobody can say
    ]
    assert starts(gpus, running, waiting) == {
        "2": NOW + 100,
        "3": NOW + 150,
        "4": NOW + 180,
        "5": NOW + 150,
        "6": None,
        "7": None,
    }


def test_a_job_that_starts_now_is_now_and_shared_memory_jobs_pack() -> None:
    gpus = [QueueGpu("a", 80 * GIB)]
    waiting = [
        Waiting("1", "u", 1, NOW - 3, mem=30 * GIB, time_limit=60.0),
        Waiting("2", "u", 1, NOW - 2, mem=30 * GIB, time_limit=60.0),
        Waiting("3", "u", 1, NOW - 1, mem=30 * GIB, time_limit=60.0),  # a third does not fit
    ]
    assert starts(gpus, [], waiting) == {"1": NOW, "2": NOW, "3": NOW + 60}
