"""An ended job's files (exit record, marker) leave the service's status directory in a
batch at the loop's tick once it is quiet (service.litter): when no job waits to
start, or when no job ended during the last tick although others wait for GPUs, and
never on the way from a freed GPU to the next start (tests/test_service_counts.py
counts the batches)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rawservice import Raw
from waiting import wait_for


def job(work: Path, argv: list[str], count: int = 1) -> dict[str, Any]:
    return {
        "argv": argv,
        "cwd": str(work),
        "env": {"PATH": "/usr/bin:/bin"},
        "output": "/dev/null",
        "request": {"count": count},
    }


def files_of(work: Path, job_id: int) -> list[str]:
    return sorted(p.name for p in (work / "state" / "jobs").glob(f"{job_id}.*"))


def batches(service: Raw) -> int:
    return int(service.call("stats")["litter"]["batches"])


def test_an_ended_jobs_files_go_once_the_loop_is_quiet(raw_service: Raw, tmp_path: Path) -> None:
    service = raw_service
    before = batches(service)
    alone = service.call("submit", **job(tmp_path, ["true"]))["job"]
    wait_for(
        lambda: batches(service) > before and not files_of(tmp_path, alone),
        30,
        lambda: f"job {alone}'s files removed: {files_of(tmp_path, alone)}",
    )
    # Three GPUs taken for long, a job that needs two waiting for them: the queue is
    # never empty. A job that ends on the fourth leaves its files until a tick sees no
    # other end since the one before.
    sleepers = [service.call("submit", **job(tmp_path, ["sleep", "120"]))["job"] for _ in range(3)]
    waiting = service.call("submit", **job(tmp_path, ["true"], count=2))["job"]
    before = batches(service)
    short = service.call("submit", **job(tmp_path, ["true"]))["job"]
    try:
        wait_for(
            lambda: batches(service) > before and not files_of(tmp_path, short),
            30,
            lambda: f"job {short}'s files removed: {files_of(tmp_path, short)}",
        )
        assert service.call("stats")["litter"]["kept"] == 0
        assert service.call("stats")["jobs"]  # the sleepers and the waiting job are there
    finally:
        service.call("cancel", jobs=[*sleepers, waiting])


def test_a_batch_goes_when_quiet_and_the_oldest_batch_when_too_many_wait(tmp_path: Path) -> None:
    from types import SimpleNamespace

    from gpuwarden.service import litter
    from gpuwarden.service import store as st
    from gpuwarden.service.joblife import JobLife

    assert litter.due(10, quiet=True) == 10
    assert litter.due(litter.KEEP_MOST - 1, quiet=True) == litter.BATCH  # a burst: in turns
    assert litter.due(litter.KEEP_MOST - 1, quiet=False) == 0  # busy: they wait
    assert litter.due(litter.KEEP_MOST * 3, quiet=False) == litter.BATCH  # a turn stays short
    paths = [tmp_path / f"{n}.exit" for n in range(5)]
    for path in paths:
        path.write_text("{}")
    journal = st.Store(str(tmp_path / "state.db"))
    life = SimpleNamespace(store=journal, litter=[str(p) for p in paths], litter_batches=0)
    JobLife.remove_litter(life, 2)  # type: ignore[arg-type]
    assert [p.exists() for p in paths] == [False, False, True, True, True]
    assert life.litter == [str(p) for p in paths[2:]] and life.litter_batches == 1
    JobLife.remove_litter(life)  # type: ignore[arg-type]
    assert not any(p.exists() for p in paths) and life.litter == []
