"""The queue, history and share tables: one shape whatever ran the job."""

from __future__ import annotations

from gpuwarden.cli import jobtables as t

NOW = 1_000_000.0


def job(**kw: object) -> dict:
    base = {
        "id": 1,
        "user": "alice",
        "state": "RUNNING",
        "count": 2,
        "gpus": ["GPU-a", "GPU-b"],
        "indices": [0, 1],
        "submitted": NOW - 600,
        "started": NOW - 300,
        "elapsed": 300.0,
        "command": ["python", "train.py"],
    }
    base.update(kw)
    return base


def test_queue_lists_running_then_waiting_by_priority() -> None:
    rows = [
        job(
            id=3,
            state="PENDING",
            gpus=[],
            indices=[],
            started=None,
            priority=100.0,
            reason="Priority",
            user="carol",
            command=None,
        ),
        job(id=1),
        job(
            id=2,
            state="PENDING",
            gpus=[],
            indices=[],
            started=None,
            priority=900.0,
            reason="Resources",
            estimated_start=NOW + 125,
            user="bob",
            mem=2**30,
            count=1,
        ),
    ]
    lines = t.queue_table(rows, now=NOW).splitlines()
    assert lines[0].split() == [
        "JOB",
        "USER",
        "STATE",
        "GPUS",
        "REASON",
        "PRIORITY",
        "WAITED",
        "ELAPSED",
        "LIMIT",
        "CPU",
        "PEAKMEM",
        "COMMAND",
    ]
    assert [line.split()[0] for line in lines[1:]] == ["1", "2", "3"]
    assert "2@0,1" in lines[1] and "5m00s" in lines[1] and "python train.py" in lines[1]
    assert "(1 shared)" in lines[2] and "Resources (start in ~2m05s)" in lines[2]
    assert "(hidden)" in lines[3] and "Priority" in lines[3]


def test_other_users_text_is_escaped() -> None:
    out = t.queue_table([job(user="ev\x1b[2Jil", command=["echo", "\x1b]0;pwned\x07"])], now=NOW)
    assert "\x1b" not in out and "\\x1b" in out


def test_history_and_share() -> None:
    ended = [
        job(
            id=5,
            state="COMPLETED",
            exit_code=0,
            ended=NOW,
            elapsed=7200.0,
            cpu_seconds=3725.0,
            mem_peak=3 << 30,
        ),
        job(id=4, state="TIMEOUT", signal=15, ended=NOW - 10, elapsed=60.0),
        job(id=6, state="LOST", error="its supervisor died", ended=NOW, elapsed=1.0),
    ]
    out = t.history_table(ended)
    assert "exit 0" in out and "4.00" in out and "signal 15" in out and "supervisor died" in out
    lines = out.splitlines()
    assert "CPU" in lines[0].split() and "PEAKMEM" in lines[0].split()
    assert "1h02m" in lines[1] and "3072MiB" in lines[1]  # from its cgroup
    assert lines[2].split()[-6:-4] == ["-", "-"]  # not accounted: a dash, not a zero
    long = "job 6 could not start: cannot open output /home/alice/" + "x" * 80 + ": denied"
    cut = t.history_table([job(id=6, state="FAILED", error=long, ended=NOW, elapsed=0.0)])
    row, note = cut.splitlines()[1:]
    assert row.split()[3] == "error" and note == long  # the whole reason, below the table
    share = t.share_table(
        [
            {"user": "bob", "usage": 36000.0, "share": 1, "factor": 0.88},
            {"user": "alice", "usage": 360000.0, "share": 2, "factor": 0.28},
        ]
    )
    assert share.splitlines()[1].split() == ["alice", "100.00", "2", "0.280"]
    assert t.queue_table([]) == "no jobs queued or running"
    assert t.span(None) == "-" and t.span(90000) == "1d01h"


def test_a_gpus_cell_starts_with_a_count_whether_held_or_wanted() -> None:
    assert t.gpus_cell({"gpus": ["GPU-a", "GPU-b"], "indices": [0, 1]}) == "2@0,1"
    assert t.gpus_cell({"gpus": ["MIG-x"], "indices": [3]}) == "1@3(MIG)"
    assert t.gpus_cell({"gpus": ["GPU-a"], "indices": [None]}) == "1@?"
    assert t.gpus_cell({"gpus": [], "indices": [], "count": 2}) == "(2)"
