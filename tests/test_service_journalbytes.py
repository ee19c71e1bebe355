"""One user's queued and running jobs hold a bounded part of the root service's
journal (`service.max_journal_bytes_per_user`), with real Unix accounts: over it a
submit is refused in one line naming the setting, another user and an admin are not
bound by it, and what the user cancels makes room again."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from servicetools import Server, cli_as, serving, submit
from users import make_user


@pytest.fixture
def bounded(tmp_path: Path, open_dir: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Server]:
    monkeypatch.setenv("GPUWARDEN_SERVICE_MAX_JOURNAL_BYTES_PER_USER", "450KiB")
    yield from serving(tmp_path, open_dir, monkeypatch)


def test_a_users_journal_bytes_are_bounded_and_refused_in_one_line(bounded: Server) -> None:
    srv = bounded
    alice, bob, carol = make_user("alice", ("lab",)), make_user("bob"), make_user("carol")
    big = {"PATH": "/usr/bin:/bin", "BLOB": "x" * (100 << 10)}  # 100 KiB each
    held = [submit(srv, alice, ["true"], env=big, hold=True) for _ in range(4)]
    refused = srv.call(alice, "submit", argv=["true"], cwd=str(srv.work), env=big, hold=True)
    assert "service.max_journal_bytes_per_user" in refused["error"], refused
    assert "\n" not in refused["error"]
    # the CLI a user types says the same in one line (2,000 rows: 500 KiB more)
    done = cli_as(srv, alice, "submit", "--hold", "--array", "0-1999", "--", "true")
    assert done.returncode != 0 and done.stderr.count("\n") == 1, done.stderr
    assert "service.max_journal_bytes_per_user" in done.stderr
    # an array's common part counts once: a sweep of 1,000 small tasks fits alone
    for job in held:
        assert srv.call(alice, "cancel", jobs=[job])["jobs"] == [job]
    sweep = srv.call(
        alice, "submit", argv=["true"], cwd=str(srv.work), env=big, hold=True, array="0-999"
    )
    assert sweep.get("tasks") == 1000, sweep
    # others untouched: another user, and an admin over the bound
    assert submit(srv, bob, ["true"], env=big, hold=True)
    for _ in range(6):
        assert submit(srv, carol, ["true"], env=big, hold=True)
