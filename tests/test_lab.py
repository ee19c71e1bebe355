"""The pure parts behind `top` and `mcp`: why a job waits in words, the submit preview's
token, and the bounded tail of a job's output."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from gpuwarden.assistant.previews import TTL, Previews
from gpuwarden.base.errors import UserError
from gpuwarden.jobs.output import tail
from gpuwarden.lab.waiting import MEANINGS, explain, waiting_order

NOW = 1_700_000_000.0


def row(job: int, **kw: object) -> dict[str, object]:
    base: dict[str, object] = {"id": job, "user": "ann", "state": "PENDING", "count": 1}
    return {**base, **kw}


def test_a_waiting_job_is_explained_with_its_place_and_start() -> None:
    jobs = [
        row(1, state="RUNNING", count=4),
        row(
            2, priority=10.0, submitted=5.0, reason="Resources", count=2, estimated_start=NOW + 600
        ),
        row(3, priority=20.0, submitted=9.0, reason="Resources"),
        row(4, priority=1.0, submitted=1.0, reason="Dependency", after=[2, 3]),
    ]
    assert [j["id"] for j in waiting_order(jobs)] == [3, 2, 4]
    said = explain(jobs[1], jobs, NOW)
    assert said["reason"] == "Resources" and said["place"] == 2 and said["ahead"] == 1
    assert said["waits_for"] == ["2 GPUs"]
    assert "10m00s" in said["starts_in"] and "1 job ahead" in said["summary"]
    dep = explain(jobs[3], jobs, NOW)
    assert dep["waits_for"] == ["1 GPU", "the end of jobs 2, 3"]
    assert "no start can be estimated" in dep["summary"]
    assert explain(jobs[0], jobs, NOW)["summary"] == "job 1 is running, not waiting"


def test_every_reason_of_the_scheduler_has_a_meaning() -> None:
    from gpuwarden.planning import scheduling

    names = ("RESOURCES", "PRIORITY", "HELD", "DEPENDENCY", "DEPENDENCY_FAILED")
    names += ("USER_GPU_LIMIT", "DRAINED", "BEGIN_TIME", "BOOKED")
    assert {getattr(scheduling, name) for name in names} == set(MEANINGS)


def test_a_preview_token_sends_that_request_once_within_its_time() -> None:
    clock = [0.0]
    previews = Previews(clock=lambda: clock[0])
    request = {"argv": ["submit", "--", "true"], "cwd": "/tmp"}
    token = previews.token(request)
    for bad, why in ((None, "needs its preview's token"), ("0" * 32, "not the preview")):
        with pytest.raises(UserError, match=why):
            previews.redeem(request, bad)
    with pytest.raises(UserError, match="not the preview"):
        previews.redeem({**request, "cwd": "/"}, token)
    previews.redeem(request, token)
    with pytest.raises(UserError, match="used already"):
        previews.redeem(request, token)
    late = previews.token(request)
    clock[0] = TTL + 1
    with pytest.raises(UserError, match="used already or is over"):
        previews.redeem(request, late)
    assert Previews().token(request) != late  # another server, another key


def test_the_tail_of_an_output_is_bounded_and_printable(tmp_path: Path) -> None:
    out = tmp_path / "gpuwarden-1.out"
    assert tail(str(out), os.geteuid()) == []
    out.write_bytes(b"".join(b"line %d\n" % i for i in range(100_000)) + b"\x1b[2Jlast\xff")
    lines = tail(str(out), os.geteuid(), lines=3, limit=4096)
    assert lines == ["line 99998", "line 99999", "\\x1b[2Jlast\ufffd"]
    os.symlink(out, tmp_path / "link")
    with pytest.raises(UserError, match="symbolic link"):
        tail(str(tmp_path / "link"), os.geteuid())
