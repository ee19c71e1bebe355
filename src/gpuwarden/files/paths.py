"""Safety checks for the directories gpuwarden shares between processes and users.

Leases and drains are files in a directory that several local users may
write (the system locations under /var/lib/gpuwarden). Whoever can delete or
replace a lock file can break a lease, so a directory is only trusted when it
is a real directory (not a symlink), owned by the current user or root, and
not writable by others unless the sticky bit limits them to their own files.
A refusal names the path and the owner, because the fix is an admin's chmod
or chown.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Union

from gpuwarden.base.errors import UserError
from gpuwarden.files.safefiles import owner_name

PathLike = Union[str, "os.PathLike[str]"]


def user_name(uid: int | None = None) -> str:
    """The login name for `uid` (default: the current user), or the number if unknown."""
    return owner_name(os.getuid() if uid is None else uid)


def check_dir(path: PathLike, what: str = "directory") -> Path:
    """Raise UserError unless `path` is a directory safe to keep shared state in."""
    path = Path(path)
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        raise UserError(f"{what} {path} does not exist") from None
    except OSError as err:
        raise UserError(f"cannot use {what} {path}: {err.strerror}") from None
    if stat.S_ISLNK(st.st_mode):
        raise UserError(
            f"refusing {what} {path}: it is a symlink (owned by {user_name(st.st_uid)})"
        )
    if not stat.S_ISDIR(st.st_mode):
        raise UserError(f"refusing {what} {path}: it is not a directory")
    if st.st_uid not in (os.getuid(), 0):
        raise UserError(
            f"refusing {what} {path}: owned by {user_name(st.st_uid)}, not by you or root"
        )
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH) and not st.st_mode & stat.S_ISVTX:
        raise UserError(
            f"refusing {what} {path}: writable by others without the sticky bit "
            f"(mode {stat.S_IMODE(st.st_mode):04o}), so they could delete its files; "
            "fix with `chmod +t` or `chmod go-w`"
        )
    return path


def ensure_dir(path: PathLike, what: str = "directory") -> Path:
    """`check_dir`, creating the directory (mode 0700, parents too) when missing: a
    per-user location is private by default."""
    path = Path(path)
    if not os.path.lexists(path):
        try:
            os.makedirs(path, mode=0o700, exist_ok=True)
        except OSError as err:
            raise UserError(f"cannot create {what} {path}: {err.strerror}") from None
    return check_dir(path, what)


def check_file(path: PathLike, st: os.stat_result, what: str = "file") -> None:
    """Raise UserError unless `st` (from `os.fstat` of a file opened with O_NOFOLLOW,
    or `os.lstat`) is a regular file that only its owner can write. Files in a shared
    sticky directory belong to whoever made them, so any owner is accepted."""
    if stat.S_ISLNK(st.st_mode):
        raise UserError(
            f"refusing {what} {path}: it is a symlink (owned by {user_name(st.st_uid)})"
        )
    if not stat.S_ISREG(st.st_mode):
        raise UserError(f"refusing {what} {path}: it is not a regular file")
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise UserError(
            f"refusing {what} {path}: writable by others (mode {stat.S_IMODE(st.st_mode):04o}, "
            f"owner {user_name(st.st_uid)})"
        )
