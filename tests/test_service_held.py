"""Held jobs in the plan: a full pass plans only the jobs that may start, and the held
jobs those depend on, so a job waiting on a held one keeps waiting, Dependency; a
job held while it waits says Held at once (no pass looks at it again), and has no
priority until it is released, as Slurm's held jobs."""

from __future__ import annotations

from pathlib import Path

from rawservice import Raw, held
from waiting import wait_for


def row(raw: Raw, job_id: int) -> dict[str, object]:
    """The job as `queue` shows it while it waits or runs, as `jobs` once it ended."""
    found = raw.call("queue", ids=[job_id])["jobs"] or raw.call("jobs", ids=[job_id])["jobs"]
    return found[0]


def full_passes(raw: Raw) -> int:
    return int(raw.call("stats")["plan"]["full"])


def test_a_job_after_a_held_one_waits_through_full_passes(raw_service: Raw, tmp_path: Path) -> None:
    raw = raw_service
    first = raw.call("submit", **held(tmp_path))["job"]
    then = dict(held(tmp_path), hold=False, after=[first])
    second = raw.call("submit", **then)["job"]
    also = raw.call("submit", **held(tmp_path))["job"]
    seen = full_passes(raw)
    wait_for(lambda: full_passes(raw) > seen + 1, 30, "two full passes")  # the tick's
    assert (row(raw, first)["state"], row(raw, first)["reason"]) == ("PENDING", "Held")
    assert (row(raw, second)["state"], row(raw, second)["reason"]) == ("PENDING", "Dependency")
    listed = {r["id"]: r for r in raw.call("queue")["jobs"]}
    assert listed[also]["priority"] is None and listed[second]["priority"] is not None

    raw.call("release", jobs=[first])
    for job_id in (first, second):
        wait_for(
            lambda j=job_id: row(raw, j)["state"] == "COMPLETED",
            60,
            lambda j=job_id: f"job {j} to complete: {row(raw, j)}",
            every=0.02,
        )

    waits = raw.call("submit", **dict(held(tmp_path), hold=False, after=[also]))["job"]
    raw.call("hold", jobs=[waits])
    assert row(raw, waits)["reason"] == "Held"  # said by the hold itself
    raw.call("release", jobs=[also, waits])
    for job_id in (also, waits):
        wait_for(lambda j=job_id: row(raw, j)["state"] == "COMPLETED", 60, f"job {job_id}")
