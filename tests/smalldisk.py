"""A disk that fills: a small tmpfs mounted over a test's directory, and filling it.

A full disk is tested on a real filesystem, not with a patched `write`: a tmpfs of a
few kilobytes or megabytes fills to the last byte in a moment, and what fails is
what the kernel refuses (ENOSPC from `write`, `fsync`, `rename`, SQLite's journal).
Mounting needs root; where it cannot be done the test is skipped with the reason.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest


@contextlib.contextmanager
def small_disk(where: Path, size: str, mode: str = "0700") -> Iterator[Path]:
    """`where` (made if missing) on a tmpfs of `size` ("4m", "64k"), unmounted after."""
    if os.geteuid() != 0:
        pytest.skip("needs root to mount a small tmpfs")
    where.mkdir(parents=True, exist_ok=True)
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size},mode={mode}", "tmpfs", str(where)],
        capture_output=True,
        text=True,
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs at {where}: {mounted.stderr.strip()}")
    try:
        yield where
    finally:
        # lazily: a process the test started may still hold a file open there
        subprocess.run(["umount", "-l", str(where)], check=False)


def fill(where: Path) -> Path:
    """Fill the disk under `where` to its last byte; the file that fills it.

    Unbuffered, in large writes then single bytes: a partial last write leaves
    nothing for `close()` to fail on, and not one byte stays free.
    """
    filler = where / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        for chunk in (b"\0" * 65536, b"\0"):
            with contextlib.suppress(OSError):
                while True:
                    os.write(fd, chunk)
    finally:
        os.close(fd)
    return filler
