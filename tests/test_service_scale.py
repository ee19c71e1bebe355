"""A submit costs the same into a long queue as into an empty one.

The real service (`python -m gpuwarden serve`, as root, on the simulated four
A100s) is filled with 2,000 held jobs; the service's own CPU time per submit
then must stay within 2x of the empty queue's, measured the same way in the
same run, and the scheduling passes are coalesced, not one per submit. CPU
time, not wall time: a submit's wall time is mostly its commit's fsync, which a
busy disk moves by 2x from one moment to the next; what grew with the queue
was the work (a pass over every waiting job per submit: 5x the CPU at 2,000).
bench/service_scale.py measures wall times at 10,000 pending, beside Slurm.
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path
from typing import Any

from rawservice import Raw, cpu_ns, held
from waiting import wait_for

PENDING = 2000
SAMPLES = 200


def every_row(raw: Raw) -> list[dict[str, Any]]:
    """The whole queue, page after page."""
    rows: list[dict[str, Any]] = []
    offset: Any = 0
    while offset is not None:
        reply = raw.call("queue", offset=offset)
        rows += reply["jobs"]
        offset = reply["next"]
    return rows


def submits(raw: Raw, work: Path) -> tuple[float, float]:
    """(the service's CPU seconds per submit, the median submit's wall seconds)."""
    times = []
    cpu = cpu_ns(raw.pid)
    for _ in range(SAMPLES):
        t0 = time.perf_counter()
        raw.call("submit", **held(work))
        times.append(time.perf_counter() - t0)
    return (cpu_ns(raw.pid) - cpu) / 1e9 / SAMPLES, statistics.median(times)


def test_a_submit_into_2000_waiting_jobs_costs_what_one_into_an_empty_queue_does(
    raw_service: Raw, tmp_path: Path
) -> None:
    service = raw_service
    submits(service, tmp_path)  # warm: imports and the first pass are behind us
    empty, empty_wall = submits(service, tmp_path)
    for _ in range(PENDING // 100):  # pipelined, 100 at a time: filling is not measured
        for _ in range(100):
            service.send("submit", **held(tmp_path))
        for _ in range(100):
            service.receive()
    passes = service.call("stats")["plan"]["count"]
    full, full_wall = submits(service, tmp_path)
    after = service.call("stats")["plan"]
    assert full <= 2 * empty, (
        f"CPU per submit {full * 1000:.2f} ms at {PENDING} pending, {empty * 1000:.2f} ms empty "
        f"(wall p50 {full_wall * 1000:.2f} ms, {empty_wall * 1000:.2f} ms)"
    )
    # Coalesced: far fewer passes than submits, yet the queue's reasons stay current.
    assert after["count"] - passes < SAMPLES / 4, after

    def all_held() -> list[dict[str, Any]]:
        rows = every_row(service)
        return rows if all(r["reason"] == "Held" for r in rows) else []

    rows = wait_for(
        all_held,
        30,
        lambda: f"every row's reason Held: {sorted({r['reason'] for r in every_row(service)})}",
    )
    assert {r["reason"] for r in rows} == {"Held"}
    assert len(rows) == PENDING + 3 * SAMPLES


def test_a_start_pass_comes_at_once_and_full_passes_coalesce() -> None:
    from gpuwarden.service.pacing import FULL, REFRESH, STALE_AT_MOST, START, Pacer

    pacer = Pacer()
    assert pacer.due(0.0) == FULL  # the first pass, at start, plans everything
    pacer.begin(FULL)
    pacer.planned(FULL, 10.0, 10.5)  # a full pass that planned for half a second
    assert pacer.due(1e9) is None and pacer.wait(11.0, 1.0) == 1.0  # nothing wanted
    pacer.wake()  # something may start: at once, however long the last full pass was
    assert pacer.due(10.5) == START and pacer.wait(10.5, 60.0) == 0.0
    pacer.begin(START)
    pacer.planned(START, 10.5, 10.6)
    assert pacer.due(10.6) is None
    pacer.touch()  # a long full pass (a deep queue): refreshed within the bound
    assert pacer.due(10.5 + STALE_AT_MOST - 0.01) is None
    assert pacer.due(10.5 + STALE_AT_MOST) == FULL
    short = Pacer()
    short.begin(FULL)
    short.planned(FULL, 10.0, 10.001)  # a short one: refreshed after REFRESH of its lengths
    short.touch()
    assert short.due(10.001 + REFRESH * 0.001 - 0.01) is None
    assert short.due(10.001 + REFRESH * 0.001) == FULL
    short.wake()
    assert short.due(10.002) == START  # a start does not wait for the refresh
    short.begin(START)
    short.wake()  # a change during the pass is not lost with the pass's own flags
    assert short.due(10.003) == START
    # A start the machine refused is retried at once, once; then on the refresh.
    pacer.begin(FULL)
    pacer.planned(FULL, 20.0, 20.5)
    pacer.retry()
    assert pacer.due(20.5) == START
    pacer.begin(START)
    pacer.retry()
    assert pacer.due(20.6) is None and pacer.stale
    stats = pacer.stats()
    assert stats["count"] == 3 and stats["full"] == 2 and stats["starts"] == 1
    assert abs(stats["mean_seconds"] - 0.5) < 1e-9
