"""`service.keep_history` on the root service, with real Unix accounts: an ended job
older than it leaves the journal (`jobs` no longer lists it) for an archive only root
can read, a recent one stays, and a user's `gpuwarden report` still counts both, and
`report --waste` the GPU-hours the archived one held idle."""

from __future__ import annotations

import json
import os
import stat
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuwarden.service import store as st
from servicetools import Server, cli_as, serving, submit
from users import make_user

DAY = 86400.0


@pytest.fixture
def keeping(tmp_path: Path, open_dir: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Server]:
    """The service keeping 10 days of history, over a journal with one job of alice's
    that ended 30 days ago (its run with it, as `report` counts it)."""
    from gpuwarden.service import accounting
    from gpuwarden.usage.efficiency import GpuUse

    alice = make_user("alice", ("lab",))
    journal = st.Store(os.path.join(tmp_path, "service", "jobs.db"))
    ended = time.time() - 30 * DAY
    with journal.transaction():
        old = journal.add(
            st.new_job(
                uid=alice.uid,
                gid=alice.gid,
                user=alice.name,
                argv=("python", "train.py"),
                cwd="/tmp",
                env={},
                umask=0o022,
                request={"count": 1},
                state=st.COMPLETED,
                submitted=ended - 3600,
                started=ended - 1800,
                ended=ended,
                exit_code=0,
                gpus=("GPU-x",),
            )
        )
        run = accounting.record_run(journal.db, old, ended, st.COMPLETED, 1800.0)
        idle = GpuUse("GPU-x", 1800.0, 0.0, 0.0, 1 << 20, 80 << 30, 1e5, "gpu")  # never busy
        accounting.save_use(journal.db, old.id, run, [idle])
    journal.close()
    monkeypatch.setenv("GPUWARDEN_SERVICE_KEEP_HISTORY", "10d")
    yield from serving(tmp_path, open_dir, monkeypatch)


def test_history_older_than_keep_history_is_archived_and_still_reported(
    keeping: Server,
) -> None:
    srv = keeping
    alice = make_user("alice", ("lab",))
    job = submit(srv, alice, ["true"])
    srv.wait_state(job, ("COMPLETED",))
    srv.wait_log("1 ended jobs moved from the journal to ")  # at its first tick
    listed = [r["id"] for r in srv.call(alice, "jobs", limit=100)["jobs"]]
    assert listed == [job], listed  # the old one left the journal, the new one stays
    folder = Path(srv.state, "archive")
    files = list(folder.iterdir())
    assert len(files) == 1 and files[0].name.endswith(".jsonl.gz")
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700 and files[0].stat().st_uid == 0
    assert stat.S_IMODE(files[0].stat().st_mode) & 0o077 == 0
    done = cli_as(srv, alice, "report", "--since", "60d", "--format", "json")
    assert done.returncode == 0, done.stderr
    rows = {r["name"]: r for r in json.loads(done.stdout)}
    assert rows["gw-alice"]["jobs"] == 2, rows  # the archived one and the new one
    # the half GPU-hour the archived job held idle, from the archive, told to its owner
    done = cli_as(srv, alice, "report", "--waste", "--since", "60d", "--format", "json")
    assert done.returncode == 0, done.stderr
    (row,) = json.loads(done.stdout)
    assert row["name"] == "gw-alice" and row["gpus_idle"] == 1 and row["jobs"] == 1, row
    assert row["held_hours"] == pytest.approx(0.5) and row["idle_hours"] == pytest.approx(0.5)


def test_an_end_charges_the_account_level_only_where_it_counts(tmp_path: Path) -> None:
    """A run's GPU-seconds go to its account's usage when it names one, and to no
    account's (`-`) only while accounts have shares (fair share's account level): with
    none, that row was written at every end and read by nothing."""
    import dataclasses
    from types import SimpleNamespace

    from gpuwarden.planning.scheduling import Policy
    from gpuwarden.service.joblife import JobLife

    journal = st.Store(str(tmp_path / "jobs.db"))
    ran = journal.add(
        st.new_job(uid=0, gid=0, user="ann", argv=["true"], cwd="/", env={}, umask=18, request={})
    )
    rows = "SELECT account, user FROM account_usage ORDER BY account"
    steps = (
        ({}, None, []),
        ({}, "nlp", [("nlp", "ann")]),
        ({"nlp": 1.0}, None, [("", "ann"), ("nlp", "ann")]),
    )
    for shares, account, charged in steps:
        policy = Policy(account_shares=shares)
        life = SimpleNamespace(
            store=journal, settings=SimpleNamespace(policy=policy), sampler=None, usage_totals=None
        )
        with journal.transaction():
            job = dataclasses.replace(ran, account=account)
            JobLife.ran(life, job, time.time(), st.COMPLETED, 60.0)  # type: ignore[arg-type]
        assert [tuple(r) for r in journal.db.execute(rows)] == charged, (shares, account)
    journal.close()
