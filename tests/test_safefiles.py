"""The hostile-file primitives every reader of a shared directory uses."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from gpuwarden.base.errors import UserError
from gpuwarden.files.safefiles import (
    UnsafeFile,
    open_regular,
    printable,
    read_small,
    sweep_temporaries,
    write_atomic,
)


def _within(seconds: float, fn, *args):
    """Run fn(*args) in a thread and fail if it has not returned in time (a hang)."""
    box: dict = {}

    def target() -> None:
        try:
            box["value"] = fn(*args)
        except BaseException as err:  # handed back to the test
            box["error"] = err

    t = threading.Thread(target=target, daemon=True)
    t.start()
    t.join(seconds)
    assert not t.is_alive(), f"{fn.__name__} hung"
    if "error" in box:
        raise box["error"]
    return box.get("value")


def test_reads_a_regular_file(tmp_path: Path) -> None:
    (tmp_path / "a").write_bytes(b'{"x": 1}')
    data, st = read_small(tmp_path / "a")
    assert data == b'{"x": 1}' and st.st_size == 8


def test_a_fifo_is_refused_without_blocking(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "fifo")
    with pytest.raises(UnsafeFile, match="FIFO"):
        _within(5, read_small, tmp_path / "fifo")
    with pytest.raises(UnsafeFile, match="FIFO"):
        _within(5, open_regular, tmp_path / "fifo", os.O_WRONLY)


def test_a_symlink_to_dev_zero_is_refused(tmp_path: Path) -> None:
    os.symlink("/dev/zero", tmp_path / "zero")
    with pytest.raises(UnsafeFile, match="symbolic link"):
        _within(5, read_small, tmp_path / "zero")


def test_a_directory_and_a_huge_file_are_refused(tmp_path: Path) -> None:
    (tmp_path / "d").mkdir()
    with pytest.raises(UnsafeFile, match="directory"):
        read_small(tmp_path / "d")
    with open(tmp_path / "big", "wb") as fh:
        fh.truncate(10 << 20)
    with pytest.raises(UnsafeFile, match="bytes"):
        read_small(tmp_path / "big", limit=1024)


def test_missing_file_is_file_not_found(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        read_small(tmp_path / "nope")


def test_write_atomic_replaces_and_leaves_no_temporary(tmp_path: Path) -> None:
    tmp_path = tmp_path / "d"
    tmp_path.mkdir()
    target = tmp_path / "rec.json"
    write_atomic(target, "one")
    write_atomic(target, b"two")
    assert target.read_text() == "two"
    assert os.listdir(tmp_path) == ["rec.json"]


def test_write_atomic_failure_is_one_line_and_cleans_up(tmp_path: Path) -> None:
    tmp_path = tmp_path / "d"
    tmp_path.mkdir()
    with pytest.raises(UserError, match=r"cannot write record .*missing"):
        write_atomic(tmp_path / "missing" / "rec.json", "x", what="record")
    (tmp_path / "dir-in-the-way").mkdir()
    (tmp_path / "dir-in-the-way" / "x").write_text("")
    with pytest.raises(UserError):
        write_atomic(tmp_path / "dir-in-the-way", "x")
    assert sorted(os.listdir(tmp_path)) == ["dir-in-the-way"]


def test_sweep_removes_only_old_own_temporaries(tmp_path: Path) -> None:
    tmp_path = tmp_path / "d"
    tmp_path.mkdir()
    old = tmp_path / ".rec.json.123-abcd.tmp"
    new = tmp_path / ".rec.json.456-abcd.tmp"
    other = tmp_path / "rec.json"
    for p in (old, new, other):
        p.write_text("x")
    os.utime(old, (0, 0))
    assert sweep_temporaries(str(tmp_path), older_than=60) == 1
    assert sorted(os.listdir(tmp_path)) == sorted([new.name, other.name])


@pytest.mark.parametrize(
    ("raw", "shown"),
    [
        ("plain reason", "plain reason"),
        ("naïve 检修", "naïve 检修"),
        ("\x1b[2J\x1b[Hfake", "\\x1b[2J\\x1b[Hfake"),
        ("line\nbreak\r", "line\\x0abreak\\x0d"),
        ("bidi\u202etxt", "bidi\\u202etxt"),
    ],
)
def test_printable_escapes_control_characters(raw: str, shown: str) -> None:
    assert printable(raw) == shown
