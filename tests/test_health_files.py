"""The service's drains and XIDs, read again only when a file they come from may have
changed (health.files): unchanged files are read once; a drain added or lifted, a
record rewritten in place, an XID appended, a log swapped for another owner's, each
is seen at the next use; a file changed within the settling time is read each time."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from gpuwarden.health import drain, xidlog
from gpuwarden.health.files import HealthFiles

GPU = "GPU-11111111-2222-3333-4444-555555555555"
SETTLE = 0.05  # the tests' settling time: well over a coarse timestamp's step


def settle() -> None:
    time.sleep(SETTLE * 2)


@pytest.fixture
def state(tmp_path: Path) -> str:
    where = tmp_path / "state"
    where.mkdir(mode=0o755)
    return str(where)


def counted(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    reads: list[str] = []
    real = drain.list_drains
    monkeypatch.setattr(drain, "list_drains", lambda d: reads.append(str(d)) or real(d))
    return reads


def append_xid(state: str, xid: int) -> None:
    line = json.dumps({"uuid": GPU, "xid": xid, "index": 0, "at": time.time()})
    with open(os.path.join(state, xidlog.ROOT_LOG), "a") as fh:
        fh.write(line + "\n")


def test_unchanged_files_are_read_once(state: str, monkeypatch: pytest.MonkeyPatch) -> None:
    drain.drain(GPU, "fan", directory=state)
    append_xid(state, 79)
    settle()
    reads = counted(monkeypatch)
    files = HealthFiles(SETTLE)
    drains, xids = files.current(state)
    assert set(drains) == {GPU} and xids == {GPU: (79,)}
    for _ in range(5):
        assert files.current(state) == (drains, xids)
    assert files.reads == 1 and len(reads) == 1


def test_a_drain_added_or_lifted_is_seen(state: str) -> None:
    files = HealthFiles(SETTLE)
    settle()
    assert files.current(state)[0] == {}
    settle()
    drain.drain(GPU, "fan", directory=state)
    assert set(files.current(state)[0]) == {GPU}
    settle()
    drain.undrain(GPU, directory=state)
    assert files.current(state)[0] == {}


def test_a_record_rewritten_in_place_is_seen(state: str) -> None:
    drain.drain(GPU, "fan", directory=state)
    settle()
    files = HealthFiles(SETTLE)
    assert files.current(state)[0][GPU].reason == "fan"
    record = os.path.join(state, f"{drain.PREFIX}{GPU}{drain.SUFFIX}")
    data = json.loads(Path(record).read_text())
    with open(record, "r+") as fh:  # the same file, its name and directory untouched
        fh.write(json.dumps({**data, "reason": "a new reason"}))
    assert files.current(state)[0][GPU].reason == "a new reason"


def test_an_xid_appended_is_seen(state: str) -> None:
    append_xid(state, 79)
    settle()
    files = HealthFiles(SETTLE)
    assert files.current(state)[1] == {GPU: (79,)}
    append_xid(state, 48)
    assert files.current(state)[1] == {GPU: (79, 48)}


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a file away needs root")
def test_a_log_given_to_another_user_is_no_longer_believed(state: str) -> None:
    append_xid(state, 79)
    settle()
    files = HealthFiles(SETTLE)
    assert files.current(state)[1] == {GPU: (79,)}
    os.chown(os.path.join(state, xidlog.ROOT_LOG), 65534, 65534)
    assert files.current(state)[1] == {}


def test_what_changed_just_now_is_read_each_time(
    state: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    drain.drain(GPU, "fan", directory=state)
    reads = counted(monkeypatch)
    files = HealthFiles()  # 2 s: the record was written a moment ago
    for _ in range(3):
        files.current(state)
    assert files.reads == 3 and len(reads) == 3


def test_a_readings_health_rules_are_worked_out_once(
    state: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The service judges the GPUs twice a start (the plan, the lease) by the same
    reading of its configuration: the rules it sets are worked out once a reading, and
    again for another reading (the file changed: service.liveconfig)."""
    from gpuwarden.config import load
    from gpuwarden.health import judgement

    made: list[object] = []
    real = judgement.rules_in_force
    monkeypatch.setattr(judgement, "rules_in_force", lambda c: made.append(c) or real(c))
    monkeypatch.setenv("GPUWARDEN_STATE_DIR", state)
    files = HealthFiles(SETTLE)
    reading, other = load(), load()
    for _ in range(3):
        assert files.judged([], reading) == {}
    assert made == [reading]
    files.judged([], other)
    assert made == [reading, other]
