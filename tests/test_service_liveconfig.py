"""The service reads its configuration again only when a file of it changes, and a
changed file still takes effect at the next pass, without a reload.

The lab's system file names the state directory, where the plan finds the drains. The
file is rewritten in place (same inode, same size) to name a directory where every
GPU is drained: the next job waits, Drained; written back, the job starts. Between
the changes the service reads nothing: its count of readings stays.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from gpuwarden.health.drain import drain
from rawservice import Raw
from waiting import wait_for


def job(work: Path, count: int = 1) -> dict[str, object]:
    return {
        "argv": ["true"],
        "cwd": str(work),
        "env": {"PATH": "/usr/bin:/bin"},
        "output": "/dev/null",
        "request": {"count": count},
    }


def reads(raw: Raw) -> int:
    return int(raw.call("stats")["config"]["reads"])


def ended(raw: Raw, job_id: int) -> dict[str, object]:
    return wait_for(
        lambda: (
            (j := raw.call("jobs", ids=[job_id])["jobs"]) and j[0]["state"] == "COMPLETED" and j[0]
        ),
        60,
        f"job {job_id} to complete",
        every=0.02,
    )


@pytest.fixture
def state_from_the_file(monkeypatch: pytest.MonkeyPatch) -> None:
    """The state directory as the lab's file names it, not the tests' variable."""
    monkeypatch.delenv("GPUWARDEN_STATE_DIR", raising=False)


def test_a_changed_file_takes_effect_at_the_next_pass_and_only_then_is_read(
    state_from_the_file: None, raw_service: Raw, tmp_path: Path
) -> None:
    raw = raw_service
    lab = tmp_path / "config.toml"
    clear, drained = tmp_path / "stA", tmp_path / "stB"  # names of one length
    for folder in (clear, drained):
        folder.mkdir()
    whole = raw.call("submit", **job(tmp_path, count=4))["job"]
    uuids = ended(raw, whole)["gpus"]
    assert len(uuids) == 4, uuids
    for uuid in uuids:
        drain(uuid, "fan failure", directory=drained)

    def write(folder: Path) -> None:
        lab.write_text(f'[state]\ndir = "{folder}"\n')  # in place: the inode stays
        past = time.time() - 3600  # older than any racy write: only its stat tells
        os.utime(lab, (past, past))

    write(clear)
    inode = lab.stat().st_ino
    first = raw.call("submit", **job(tmp_path))["job"]
    ended(raw, first)
    before = reads(raw)
    for _ in range(5):  # nothing changes: nothing is read
        ended(raw, raw.call("submit", **job(tmp_path))["job"])
    assert reads(raw) == before

    write(drained)
    assert lab.stat().st_ino == inode
    waits = raw.call("submit", **job(tmp_path))["job"]
    row = wait_for(
        lambda: (r := raw.call("queue", ids=[waits])["jobs"]) and r[0]["reason"] == "Drained" and r,
        30,
        lambda: f"job {waits} to wait on the drained GPUs: {raw.call('jobs', ids=[waits])}",
        every=0.02,
    )
    assert row[0]["state"] == "PENDING", row
    assert reads(raw) == before + 1

    write(clear)
    ended(raw, waits)  # the drains are gone with the file's word for them
    assert reads(raw) == before + 2


def test_a_file_made_untrusted_or_just_written_is_read_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from gpuwarden.service.liveconfig import LiveConfig

    lab = tmp_path / "lab" / "config.toml"
    lab.parent.mkdir(mode=0o755)
    lab.write_text('[health]\npolicy = "alert"\n')
    monkeypatch.setenv("GPUWARDEN_SYSTEM_CONFIG", str(lab))
    monkeypatch.chdir(tmp_path)
    live = LiveConfig()
    assert live.current().get("health.policy") == "alert"
    assert live.current().get("health.policy") == "alert"
    assert live.stats() == {"reads": 2, "checks": 2}  # just written: racy, read again
    past = time.time() - 3600
    os.utime(lab, (past, past))
    live.current()
    live.current()
    assert live.stats() == {"reads": 3, "checks": 4}
    os.chmod(lab.parent, 0o777)  # anyone may replace it now: refused, not read
    assert live.current().refused and live.current().get("health.policy") == "drain"
    os.chmod(lab.parent, 0o755)
    assert live.current().get("health.policy") == "alert"
    monkeypatch.setenv("GPUWARDEN_HEALTH_POLICY", "drain")  # a variable over the file
    assert live.current().get("health.policy") == "drain"
    assert live.stats()["reads"] == 6


def test_an_unchanged_environment_is_not_walked_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each pass asks for the reading: the environment's variables that matter are
    filtered from it once, and again only when it changed (each entry decoded through
    os.environ was ~30 us a pass); a variable set in between is still seen."""
    from collections.abc import Mapping

    from gpuwarden.service.liveconfig import LiveConfig

    lab = tmp_path / "config.toml"
    lab.write_text('[health]\npolicy = "alert"\n')
    past = time.time() - 3600
    os.utime(lab, (past, past))
    monkeypatch.setenv("GPUWARDEN_SYSTEM_CONFIG", str(lab))
    monkeypatch.chdir(tmp_path)
    walks: list[int] = []
    environ = type(os.environ)
    monkeypatch.setattr(environ, "items", lambda self: walks.append(1) or Mapping.items(self))
    live = LiveConfig()
    for _ in range(5):
        assert live.current().get("health.policy") == "alert"
    assert live.stats() == {"reads": 1, "checks": 5}
    assert len(walks) == 1
    monkeypatch.setenv("GPUWARDEN_HEALTH_POLICY", "drain")
    assert live.current().get("health.policy") == "drain"
    assert live.stats()["reads"] == 2
