"""The service looks each user up once, not once per job: `identity.person` keeps its
answer while the user database's files are unchanged, and no longer.

A changed group membership must apply to the user's next job, as a new login would
have it: the files' stat (inode, size, times) is read before each lookup, an answer
read while a file had just changed is not kept (a second change within its
timestamp's granularity would go unseen), and nothing is kept past `KEEP_FOR`
(for what the files do not show: a directory service).
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from gpuwarden.service import identity
from users import PREFIX, make_group, make_user


@pytest.fixture
def lookups(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The uids looked up in the user database (not answered from what was kept)."""
    seen: list[int] = []
    look_up = identity._look_up

    def counted(uid: int, gid: int | None) -> identity.Person:
        seen.append(uid)
        return look_up(uid, gid)

    monkeypatch.setattr(identity, "_look_up", counted)
    monkeypatch.setattr(identity, "_people", {})
    return seen


@pytest.fixture
def sources(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> list[Path]:
    """Stand-ins for the database's files, last changed a minute ago (settled)."""
    files = [tmp_path / name for name in ("passwd", "group", "nsswitch.conf")]
    for path in files:
        path.write_text("x\n")
        os.utime(path, ns=(os.stat(path).st_atime_ns, os.stat(path).st_mtime_ns - 60 * 10**9))
    monkeypatch.setattr(identity, "SOURCES", tuple(str(p) for p in files))
    return files


def test_a_user_is_looked_up_once_while_the_files_are_unchanged(
    lookups: list[int], sources: list[Path]
) -> None:
    me = os.getuid()
    first = identity.person(me)
    assert identity.person(me) == first and identity.person(me) == first
    assert lookups == [me]
    identity.person(me, first.gid)  # the kernel's gid for a peer: its own entry
    assert lookups == [me, me]


def test_a_changed_file_is_read_again(lookups: list[int], sources: list[Path]) -> None:
    me = os.getuid()
    identity.person(me)
    sources[1].write_text("x\ny\n")  # /etc/group rewritten: a membership changed
    identity.person(me)
    identity.person(me)  # changed just now: what is read is not kept yet
    assert lookups == [me, me, me]


def test_a_settled_change_of_one_timestamp_is_seen(lookups: list[int], sources: list[Path]) -> None:
    me = os.getuid()
    identity.person(me)
    st = os.stat(sources[0])
    os.utime(sources[0], ns=(st.st_atime_ns, st.st_mtime_ns + 1))  # same size, same inode
    identity.person(me)
    assert lookups == [me, me]


def test_nothing_is_kept_past_its_time(
    lookups: list[int], sources: list[Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(identity, "KEEP_FOR", 0.0)
    me = os.getuid()
    identity.person(me)
    identity.person(me)
    assert lookups == [me, me]


def test_a_group_membership_changed_on_this_machine_applies_at_once() -> None:
    """Through the real /etc/group: a user added to a group is in it at the next
    lookup, removed from it, out of it (root, useradd: tests/users.py)."""
    user = make_user("cachecheck")
    gid = make_group("cachegrp")
    identity.person(user.uid)
    for member in (True, False):
        change = ["usermod", "-aG", PREFIX + "cachegrp"] if member else ["gpasswd", "-d"]
        args = [*change, user.name] if member else [*change, user.name, PREFIX + "cachegrp"]
        subprocess.run(args, check=True, capture_output=True)
        assert (gid in identity.person(user.uid).groups) is member
        assert (gid in identity.person(user.uid).groups) is member
