"""`service.keep_history` on the root service, with real Unix accounts: an ended job
older than it leaves the journal (`jobs` no longer lists it) for an archive only root
can read, and a user's `gpuwarden report` still counts it, and `report --waste` the
GPU-hours it held idle (the service samples every second)."""

from __future__ import annotations

import json
import signal
import stat
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from servicetools import Server, cli_as, serving, submit
from users import make_user


@pytest.fixture
def keeping(tmp_path: Path, open_dir: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Server]:
    monkeypatch.setenv("GPUWARDEN_SERVICE_KEEP_HISTORY", "1s")
    monkeypatch.setenv("GPUWARDEN_SERVICE_SAMPLE_SECONDS", "1")
    yield from serving(tmp_path, open_dir, monkeypatch)


def test_history_older_than_keep_history_is_archived_and_still_reported(
    keeping: Server,
) -> None:
    srv = keeping
    alice = make_user("alice", ("lab",))
    job = submit(srv, alice, ["sleep", "3"], request={"count": 1})  # its GPU left idle
    ended = srv.wait_state(job, ("COMPLETED",))
    time.sleep(1.5)  # older than keep_history now
    srv.kill(signal.SIGTERM)
    srv.start()  # its first tick looks for history to archive
    srv.wait_log("ended jobs moved from the journal to ")
    listed = srv.call(alice, "jobs", limit=100)
    assert job not in [r["id"] for r in listed["jobs"]], listed
    folder = Path(srv.state, "archive")
    files = list(folder.iterdir())
    assert len(files) == 1 and files[0].name.endswith(".jsonl.gz")
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700 and files[0].stat().st_uid == 0
    assert stat.S_IMODE(files[0].stat().st_mode) & 0o077 == 0
    done = cli_as(srv, alice, "report", "--since", "1d", "--format", "json")
    assert done.returncode == 0, done.stderr
    rows = {r["name"]: r for r in json.loads(done.stdout)}
    assert rows["gw-alice"]["jobs"] == 1, rows
    # the GPU-hour it held idle, from the archive's samples, told to its owner
    done = cli_as(
        srv, alice, "report", "--waste", "--by", "job", "--since", "1d", "--format", "json"
    )
    assert done.returncode == 0, done.stderr
    (row,) = json.loads(done.stdout)
    assert row["name"] == str(job) and row["gpus_idle"] == 1, row
    held = ended["elapsed"] / 3600
    assert row["held_hours"] == pytest.approx(held, rel=0.05), row
    assert row["idle_hours"] == pytest.approx(held, rel=0.05), row
