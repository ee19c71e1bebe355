"""`gpuwarden jobs -n 1000000` against a root service with a long history: the
service answers page by page and does not grow by what the user asks for (it once
grew from 63 to 486 MB, for good); the user's own client holds the rows."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from gpuwarden.service import store as st
from servicetools import Server, cli_as, serving
from users import make_user

ENDED = 30000


def _rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def test_a_million_row_listing_is_paged_without_growing_the_service(
    tmp_path: Path, open_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    alice = make_user("alice", ("lab",))
    srv = Server(tmp_path, open_dir / "work", ())
    journal = st.Store(os.path.join(srv.state, "jobs.db"))
    now = time.time()
    with journal.transaction():
        for i in range(ENDED):
            job = st.new_job(
                uid=alice.uid,
                gid=alice.gid,
                user=alice.name,
                argv=("python", "train.py", "--seed", str(i), "x" * 300),
                cwd="/tmp",
                env={"PATH": "/usr/bin:/bin"},
                umask=0o022,
                request={"count": 1},
                state=st.COMPLETED,
                ended=now - i,
                exit_code=0,
            )
            journal.add(job)
    journal.close()
    gen = serving(tmp_path, open_dir, monkeypatch)
    srv = next(gen)
    try:
        assert srv.proc is not None
        warm = cli_as(srv, alice, "jobs", "-n", "1000", "--json")  # what any listing costs
        assert warm.returncode == 0, warm.stderr
        before = _rss(srv.proc.pid)
        done = cli_as(srv, alice, "jobs", "-n", "1000000", "--json")
        assert done.returncode == 0, done.stderr
        assert len(json.loads(done.stdout)) == ENDED
        grown = _rss(srv.proc.pid) - before
        assert grown < 16 << 20, f"the service grew by {grown / 1e6:.0f} MB"
    finally:
        for _ in gen:
            pass
