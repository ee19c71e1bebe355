"""The lease directory, checked before use (see docs/leases.md).

A symlink, an unexpected owner, a directory others may write without the
sticky bit, or a network filesystem (where flock is emulated and not inherited)
would let another local user delete or redirect the locks, or make leases not
hold at all, so each is refused with one line naming the fix. Lock files inside
are opened only as regular files of an expected owner.
"""

from __future__ import annotations

import os
import select
import stat

from gpuwarden.base.errors import UserError
from gpuwarden.files.safefiles import UnsafeFile, open_regular, owner_name

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Optional

    Stamp = tuple[tuple[int, ...], ...]


class LeaseDir:
    """A checked lease directory. `shared` when other users may write into it (sticky,
    as /tmp): their lock files are then expected; in a private one they are not."""

    def __init__(self, path: str, shared: bool, owner_uid: int) -> None:
        self.path = path
        self.shared = shared
        self.owner_uid = owner_uid

    def join(self, name: str) -> str:
        return os.path.join(self.path, name)

    def check_owner(self, path: str, st: os.stat_result) -> None:
        """Refuse, in a private lease directory, a file another user made."""
        me = os.geteuid()
        if not self.shared and st.st_uid not in (me, 0, self.owner_uid):
            raise UserError(
                f"lease file {path} is owned by {owner_name(st.st_uid)}, not by {owner_name(me)}, "
                f"in a private lease directory; refusing it"
            )

    def open(self, name: str, flags: int = os.O_RDONLY | os.O_CREAT) -> int:
        """Open a lock file in the directory: never through a symlink, never blocking on
        a FIFO, only a regular file (safefiles.open_regular), of an expected owner."""
        path = self.join(name)
        try:
            # In a directory others may not write (a user's own, or the queue service's),
            # nobody else needs to open a lock file: 0600 keeps them from holding it.
            mode = 0o644 if self.shared else 0o600
            fd, st = open_regular(path, flags, mode, what="lease file")
        except UnsafeFile as err:
            raise UserError(
                f"{err}; whoever made it (see `ls -l {path}`) could block or redirect the "
                "lock: an admin should remove it"
            ) from None
        except PermissionError as err:
            if self.owner_uid == 0 and os.geteuid() != 0 and not os.access(self.path, os.W_OK):
                # Root's 0755 directory: the queue service's, and it is not answering
                # (else the command would have gone through it).
                raise UserError(
                    f"the GPUs' leases belong to the queue service ({self.path}, root's), "
                    "which is not running: ask an admin to start it "
                    "(`sudo systemctl start gpuwarden`; `gpuwarden service status` says more)"
                ) from None
            raise UserError(f"cannot open lease file {path}: {err.strerror}") from None
        except OSError as err:
            raise UserError(f"cannot open lease file {path}: {err.strerror}") from None
        try:
            self.check_owner(path, st)
        except BaseException:
            os.close(fd)
            raise
        return fd


def _check_component(path: str, st: os.stat_result, what: str) -> None:
    me = os.geteuid()
    if st.st_uid not in (me, 0):
        raise UserError(
            f"{what} {path} is owned by {owner_name(st.st_uid)}, not by {owner_name(me)} or root; "
            "refusing it: its owner could delete or replace the locks"
        )
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH) and not st.st_mode & stat.S_ISVTX:
        raise UserError(
            f"{what} {path} (owner {owner_name(st.st_uid)}, mode {stat.S_IMODE(st.st_mode):o}) is "
            "writable by others without the sticky bit; refusing it: anyone could delete "
            "the locks (chmod +t it, as /tmp is, or use a private directory)"
        )


def check_dir(path: str) -> LeaseDir:
    """Check an existing lease directory and every directory above it."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        raise UserError(f"lease directory {path} does not exist") from None
    if stat.S_ISLNK(st.st_mode):
        raise UserError(
            f"lease directory {path} is a symbolic link (owner {owner_name(st.st_uid)}, to "
            f"{os.readlink(path)}); refusing it: whoever controls the link controls the locks"
        )
    if not stat.S_ISDIR(st.st_mode):
        raise UserError(f"lease directory {path} is not a directory")
    _check_component(path, st, "lease directory")
    # Above it, a directory another user may rename would let them swap the whole tree.
    parent = os.path.dirname(os.path.realpath(path))
    while True:
        _check_component(parent, os.stat(parent), "directory")
        up = os.path.dirname(parent)
        if up == parent:
            break
        parent = up
    fstype = filesystem_type(os.path.realpath(path))
    if fstype in NETWORK_FILESYSTEMS or fstype.startswith("fuse."):
        raise UserError(
            f"lease directory {path} is on {fstype}: there flock is emulated with locks that "
            "a job does not inherit and that other machines see, so leases would not hold; "
            "set lease.dir (or GPUWARDEN_LEASE_DIR) to a local directory such as "
            "/var/lib/gpuwarden/leases"
        )
    shared = bool(st.st_mode & (stat.S_IWGRP | stat.S_IWOTH)) or st.st_uid != os.geteuid()
    return LeaseDir(path, shared, st.st_uid)


# Where Linux emulates flock with POSIX byte-range locks (owned by a process, not
# inherited by its children) or has no shared locks at all.
NETWORK_FILESYSTEMS = frozenset({"nfs", "nfs4", "cifs", "smb3", "smbfs", "9p", "ceph", "lustre"})


def filesystem_type(path: str, mounts: str = "/proc/mounts") -> str:
    """The type of the filesystem holding `path` (longest mount point that contains it);
    "" when it cannot be told."""
    best, kind = "", ""
    try:
        with open(mounts) as fh:
            for line in fh:
                fields = line.split()
                if len(fields) < 3:
                    continue
                point = fields[1].replace("\\040", " ")
                inside = path == point or path.startswith(point.rstrip("/") + "/")
                if inside and len(point) >= len(best):
                    best, kind = point, fields[2]
    except OSError:
        return ""
    return kind


def open_dir(path: Optional[str] = None, create: bool = True) -> LeaseDir:
    """The configured lease directory (config `lease.dir`, GPUWARDEN_LEASE_DIR, the system
    one, else per user), checked; a missing one is created private (0700)."""
    if path is None:
        from gpuwarden.files.locations import lease_location

        path = lease_location()
    path = os.path.abspath(path)
    if create and not os.path.lexists(path):
        try:
            os.makedirs(path, mode=0o700, exist_ok=True)
        except OSError as err:
            raise UserError(f"cannot create lease directory {path}: {err.strerror}") from None
    return check_dir(path)


class Checked:
    """A long-lived process's lease directories (the queue service's), each checked in
    full (`open_dir`) once and again whenever anything the check judged may have
    changed: the lstat (device, inode, type, mode, owner) of the directory and of each
    directory above it (and above its real path, where a symlink leads elsewhere;
    a symlink's inode change time too: one replaced is another), and the mount table,
    which the kernel marks on every mount and unmount (proc(5): /proc/self/mounts is
    pollable). A job's start then costs a few lstats and one poll instead of a walk
    with realpath and a read of /proc/mounts; a swapped directory, a changed owner or
    mode, a new mount, each is a full check again. `checks` counts the full ones.

    A loop that calls `turn` as it wakes has each directory judged once a turn (its
    end's release, its pass's listing and its start's lease use one judgement): what
    could change it (a swap, a chmod, a mount) comes between turns, where it is seen."""

    def __init__(self, mounts: str = "/proc/self/mounts") -> None:
        self._known: dict[str, tuple[Stamp, LeaseDir]] = {}
        self._mounts = mounts
        self._poll: Optional[select.poll] = None
        self._fd = -1
        self.checks = 0
        self._judged: Optional[set[str]] = None  # this turn's judged paths (None: no turns)

    def turn(self) -> None:
        """A new turn of the caller's loop: each directory is judged again at its next use."""
        self._judged = set()

    def open(self, path: Optional[str] = None, create: bool = True) -> LeaseDir:
        """`open_dir(path, create)`, checked again only when something above changed."""
        if path is None:
            from gpuwarden.files.locations import lease_location

            path = lease_location()
        path = os.path.abspath(path)
        judged = self._judged
        if judged is not None and path in judged and path in self._known:
            return self._known[path][1]
        if self._mounts_moved():  # the event is taken once: every directory is judged again
            self._known.clear()
        known = self._known.get(path)
        if known is not None and _stamp(path) == known[0]:
            if judged is not None:
                judged.add(path)
            return known[1]
        self._known.pop(path, None)
        before = _stamp(path)  # taken first: a change during the check misses next time
        self.checks += 1
        checked = open_dir(path, create)
        if before is not None and self._poll is not None:
            self._known[path] = (before, checked)
            if judged is not None:
                judged.add(path)
        return checked

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
        self._fd, self._poll = -1, None
        self._known.clear()

    def _mounts_moved(self) -> bool:
        """Whether a mount or unmount happened since the last call (True the first
        time; always True where the mount table cannot be watched: nothing is kept)."""
        if self._poll is None:
            try:
                self._fd = os.open(self._mounts, os.O_RDONLY | os.O_CLOEXEC)
            except OSError:
                return True
            self._poll = select.poll()
            self._poll.register(self._fd, select.POLLPRI)
            return True
        return any(mask & (select.POLLPRI | select.POLLERR) for _, mask in self._poll.poll(0))


def _stamp(path: str) -> Optional[Stamp]:
    """What `check_dir` judged of `path` and the directories above it, as lstat shows
    it (None: one is missing or unreadable)."""
    seen: list[tuple[int, ...]] = []
    linked = False
    try:
        for place in _chain(path):
            st = os.lstat(place)
            if stat.S_ISLNK(st.st_mode):
                linked = True
                seen.append((st.st_dev, st.st_ino, st.st_mode, st.st_uid, st.st_ctime_ns))
            else:
                seen.append((st.st_dev, st.st_ino, st.st_mode, st.st_uid))
        if linked:  # where the symlinks lead now: their targets' directories too
            for place in _chain(os.path.realpath(path)):
                st = os.lstat(place)
                seen.append((st.st_dev, st.st_ino, st.st_mode, st.st_uid))
    except OSError:
        return None
    return tuple(seen)


def _chain(path: str) -> list[str]:
    """`path` and every directory above it, up to /."""
    chain = [path]
    while True:
        up = os.path.dirname(chain[-1])
        if up == chain[-1]:
            return chain
        chain.append(up)
