"""The queue service's lease directory, checked in full once and again whenever what
the check judged may have changed (leases.dir.Checked): a swapped, re-owned or
opened directory, or one above it, is refused at its next use, never served from
what an earlier check said; a mount or unmount anywhere means a full check again."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from gpuwarden.base.errors import UserError
from gpuwarden.leases import dir as leasedir

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="changing owners needs root")


def test_a_second_use_reads_no_mount_table(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    read: list[str] = []
    real = leasedir.filesystem_type
    monkeypatch.setattr(leasedir, "filesystem_type", lambda p: read.append(p) or real(p))
    checked = leasedir.Checked()
    made = checked.open(str(tmp_path / "leases"))
    assert os.stat(made.path).st_mode & 0o777 == 0o700  # made private, as open_dir does
    first = checked.open(str(tmp_path / "leases"))  # one just made is checked once more
    for _ in range(5):
        assert checked.open(str(tmp_path / "leases")) is first
    assert checked.checks == 2
    assert len(read) == 2


def test_a_loop_s_turn_judges_the_directory_once_and_the_next_turn_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The service's turn uses the directory three times (an end's release, the pass's
    listing, the start's lease): one judgement (a walk of lstats up to /) serves them;
    a change between turns is judged at the next turn's first use."""
    checked = leasedir.Checked()
    path = str(tmp_path / "leases")
    checked.open(path)
    checked.open(path)  # one just made is checked once more
    stamped: list[str] = []
    real = leasedir._stamp
    monkeypatch.setattr(leasedir, "_stamp", lambda p: stamped.append(p) or real(p))
    checked.turn()
    first = checked.open(path)
    assert checked.open(path) is first and checked.open(path) is first
    assert stamped == [path]
    os.chmod(path, 0o777)
    checked.turn()
    with pytest.raises(UserError, match="sticky"):
        checked.open(path)
    with pytest.raises(UserError, match="sticky"):  # refused, never kept for the turn
        checked.open(path)


def test_a_directory_opened_to_everyone_is_refused_at_its_next_use(tmp_path: Path) -> None:
    checked = leasedir.Checked()
    path = str(tmp_path / "leases")
    checked.open(path)
    os.chmod(path, 0o777)
    with pytest.raises(UserError, match="sticky"):
        checked.open(path)
    os.chmod(path, 0o1777)
    assert checked.open(path).shared  # checked again: now a shared one, as /tmp is


def test_a_directory_above_opened_to_everyone_is_refused(tmp_path: Path) -> None:
    checked = leasedir.Checked()
    above = tmp_path / "above"
    path = str(above / "leases")
    checked.open(path)
    above.chmod(0o777)
    with pytest.raises(UserError, match="sticky"):
        checked.open(path)


def test_a_swapped_directory_is_checked_again(tmp_path: Path) -> None:
    checked = leasedir.Checked()
    path = tmp_path / "leases"
    checked.open(str(path))
    path.rename(tmp_path / "old")
    other = tmp_path / "elsewhere"
    other.mkdir(mode=0o700)
    path.symlink_to(other)  # the name now leads elsewhere: refused, as open_dir does
    with pytest.raises(UserError, match="symbolic link"):
        checked.open(str(path))
    path.unlink()
    (tmp_path / "old").rename(path)
    assert checked.open(str(path)).path == str(path)
    assert checked.checks == 3


def test_a_symlink_above_that_leads_elsewhere_is_followed_again(tmp_path: Path) -> None:
    checked = leasedir.Checked()
    mine, theirs = tmp_path / "mine", tmp_path / "theirs"
    (mine / "leases").mkdir(parents=True, mode=0o700)
    (theirs / "leases").mkdir(parents=True, mode=0o700)
    link = tmp_path / "link"
    link.symlink_to(mine)
    checked.open(str(link / "leases"))
    theirs.chmod(0o777)  # not mine to trust: anyone may swap what is inside
    link.unlink()
    link.symlink_to(theirs)
    with pytest.raises(UserError, match="sticky"):
        checked.open(str(link / "leases"))


@needs_root
def test_a_directory_given_to_another_user_is_refused(tmp_path: Path) -> None:
    checked = leasedir.Checked()
    path = tmp_path / "leases"
    checked.open(str(path))
    os.chown(path, 65534, 65534)
    with pytest.raises(UserError, match="owned by"):
        checked.open(str(path))


@needs_root
@pytest.mark.skipif(shutil.which("unshare") is None, reason="unshare (util-linux) is missing")
def test_a_mount_means_a_full_check_again(tmp_path: Path) -> None:
    """In a mount namespace of its own (the machine's mounts are left alone): a mount
    elsewhere means one full check (the kernel says only that the table changed), and
    a tmpfs mounted over the directory's parent is seen: the directory made there is
    checked."""
    script = textwrap.dedent(
        f"""
        import os, subprocess
        from gpuwarden.leases import dir as leasedir
        checked = leasedir.Checked()
        path = {str(tmp_path / "above" / "leases")!r}
        os.makedirs(path, mode=0o700)
        first = checked.open(path)
        assert checked.open(path) is first and checked.checks == 1
        elsewhere = {str(tmp_path / "elsewhere")!r}
        os.mkdir(elsewhere)
        subprocess.run(["mount", "-t", "tmpfs", "none", elsewhere], check=True)
        assert checked.open(path).path == path and checked.checks == 2, checked.checks
        subprocess.run(["mount", "-t", "tmpfs", "none", os.path.dirname(path)], check=True)
        os.mkdir(path, 0o700)
        again = checked.open(path)
        assert checked.checks == 3 and again is not first, checked.checks
        assert checked.open(path) is again and checked.checks == 3
        other = {str(tmp_path / "other")!r}
        os.makedirs(other, mode=0o700)
        checked.open(other)
        assert checked.checks == 4
        subprocess.run(["mount", "-t", "tmpfs", "none", elsewhere], check=True)
        checked.open(path)  # takes the kernel's one event: both are judged again
        checked.open(other)
        assert checked.checks == 6, checked.checks
        print("ok")
        """
    )
    done = subprocess.run(
        ["unshare", "--mount", "--propagation", "private", sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr
