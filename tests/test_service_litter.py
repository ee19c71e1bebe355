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
