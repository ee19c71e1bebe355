"""Whether a config file may be read: owned by you or root, and nobody else can change it.

A config file can name a command (`health.hook`) that gpuwarden runs, so a file
another user can write is a way to run code as whoever runs gpuwarden, root
included. As git's `safe.directory` does, a file is read only when it, and the
directory holding it, belong to the user running gpuwarden or to root and nobody
else can change them; who owns what comes from `stat`, never from the file.
Imported only when a config file exists (`gpuwarden.config.load`).
"""

from __future__ import annotations

import os

TYPE_CHECKING = False  # typing stays off the start-up path; annotations need it only here
if TYPE_CHECKING:
    from typing import Optional


def _owner(uid: int) -> str:
    import pwd

    try:
        return f"{pwd.getpwuid(uid).pw_name} (uid {uid})"
    except KeyError:
        return f"uid {uid}"


def _others_can_write(st: os.stat_result) -> bool:
    """Whether anyone but the owner (and root) can write through this inode's mode.
    Group write counts only when someone else is in the group: with user private
    groups (Debian's default umask 002) every file is group-writable by its owner
    alone."""
    import stat

    if st.st_mode & stat.S_IWOTH:
        return True
    if not st.st_mode & stat.S_IWGRP:
        return False
    import grp
    import pwd

    try:
        group = grp.getgrgid(st.st_gid)
    except KeyError:
        return True  # a group nobody can name: assume the worst
    try:
        owner = pwd.getpwuid(st.st_uid).pw_name
    except KeyError:
        return True
    if any(member != owner for member in group.gr_mem):
        return True
    if group.gr_name == owner:  # the owner's private group, as useradd makes it
        return False
    # Someone may have it as their primary group without being listed as a member.
    return any(p.pw_gid == st.st_gid and p.pw_uid != st.st_uid for p in pwd.getpwall())


def _untrusted(st: os.stat_result, what: str, directory: bool = False) -> Optional[str]:
    """Why a file or directory with this `stat` must not be trusted, or None."""
    import stat

    if st.st_uid not in (os.geteuid(), 0):
        return f"{what} is owned by {_owner(st.st_uid)}, not by you or root"
    if directory and st.st_mode & stat.S_ISVTX:
        return None  # sticky: others may add files but not replace or rename ours
    if _others_can_write(st):
        return f"{what} is writable by others (mode {stat.S_IMODE(st.st_mode):04o})"
    return None


def refusal(path: str) -> Optional[str]:
    """Why the config file at `path` must not be read, or None when it may be."""
    import stat

    try:
        st = os.lstat(path)
        if stat.S_ISLNK(st.st_mode):
            # A symlink (dotfile managers use them) is followed only when its owner
            # is trusted; then the target and its directory are judged as well.
            if st.st_uid not in (os.geteuid(), 0):  # a link's own mode means nothing
                return f"the symlink is owned by {_owner(st.st_uid)}, not by you or root"
            st = os.stat(path)
        if not stat.S_ISREG(st.st_mode):
            return "not a regular file"
        why = _untrusted(st, "the file")
        if why:
            return why
        directories = {
            os.path.dirname(os.path.abspath(path)),
            os.path.dirname(os.path.realpath(path)),
        }
        for directory in sorted(directories):
            why = _untrusted(os.stat(directory), f"its directory {directory}", directory=True)
            if why:
                return why
    except OSError as err:
        return f"cannot check it: {err.strerror}"
    return None


def owned_refusal(path: str, what: str) -> Optional[str]:
    """Why a file that will be *run* (a pickled call) must not be, or None: as ssh's
    StrictModes, it must be a regular file of the user running it (not a link) that
    nobody else can change, and every directory above it, up to /, the user's or
    root's and not writable by others (unless sticky: then nobody can replace what is
    ours in it)."""
    import stat

    try:
        st = os.lstat(path)
        if not stat.S_ISREG(st.st_mode):
            return f"{what} {path} is not a regular file"
        if st.st_uid != os.geteuid():
            return f"{what} {path} is owned by {_owner(st.st_uid)}, not by you"
        why = _untrusted(st, f"{what} {path}")
        if why:
            return why
        folder = os.path.dirname(os.path.abspath(path))
        while True:
            why = _untrusted(os.stat(folder), f"the directory {folder}", directory=True)
            if why:
                return f"{why}: others could replace {what}"
            parent = os.path.dirname(folder)
            if parent == folder:
                return None
            folder = parent
    except OSError as err:
        return f"cannot check {what} {path}: {err.strerror}"


_WARNED: set[str] = set()


def warn_refused(path: str, why: str) -> None:
    """One line per refused file and process: `load` runs several times per command."""
    if path in _WARNED:
        return
    _WARNED.add(path)
    import sys

    print(f"gpuwarden: ignoring config file {path}: {why}", file=sys.stderr)
