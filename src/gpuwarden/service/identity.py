"""Who is asking: the kernel's answer, never the client's.

The service learns the uid and gid of the process on the other end of its socket
from `SO_PEERCRED`, taken by the kernel when that process connected. Names and
supplementary groups come from the system's user database for that uid.
`$USER`, `$LOGNAME` or any name in a request are never read.
"""

from __future__ import annotations

import grp
import os
import pwd
import socket
import struct
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Optional

from gpuwarden.base.errors import UserError

_UCRED = struct.Struct("3i")  # struct ucred: pid_t pid; uid_t uid; gid_t gid


@dataclass(frozen=True)
class Person:
    """A local user as the kernel and the user database know them."""

    uid: int
    gid: int  # primary group
    name: str
    groups: tuple[int, ...]  # every group, the primary one included
    home: str = "/"
    shell: str = "/bin/sh"

    @property
    def is_root(self) -> bool:
        return self.uid == 0


#: The files the user database is read from where it is local (nsswitch "files"): a
#: looked-up person is kept while none of them changes (`_sources`).
SOURCES = ("/etc/passwd", "/etc/group", "/etc/nsswitch.conf")
#: And at most this long, for what the files do not show (an LDAP or sssd directory,
#: whose own caches keep entries far longer).
KEEP_FOR = 10.0
#: A file changed this recently may change again within its timestamp's granularity
#: unseen: what is read then is not kept.
SETTLED = 2.0

_people: dict[tuple[int, Optional[int]], tuple[object, float, Person]] = {}


def _sources() -> tuple[Optional[tuple[int, int, int, int]], ...]:
    stamps: list[Optional[tuple[int, int, int, int]]] = []
    for path in SOURCES:
        try:
            st = os.stat(path)
        except OSError:
            stamps.append(None)
            continue
        stamps.append((st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns))
    return tuple(stamps)


def person(uid: int, gid: int | None = None) -> Person:
    """The user `uid` from the user database; `gid` (from the kernel) overrides the
    primary group the database gives. A uid with no entry is refused: a job cannot
    be run as a user the system does not know (no home, no groups to set).

    The service asks this for every job it starts and every client that connects:
    the answer is kept while the database's files are unchanged (their stat, read
    before the lookup) for up to `KEEP_FOR` seconds, so a changed group membership
    applies to the next job, as a new login would have it, without a walk of
    /etc/passwd and /etc/group per job."""
    key = (uid, gid)
    stamp = _sources()
    now = time.monotonic()
    known = _people.get(key)
    if known is not None and known[0] == stamp and now - known[1] < KEEP_FOR:
        return known[2]
    found = _look_up(uid, gid)
    settled = time.time_ns() - int(SETTLED * 1e9)
    if all(s is None or s[2] < settled for s in stamp):
        if len(_people) > 4096:  # uids come from the kernel, not from requests; still bounded
            _people.clear()
        _people[key] = (stamp, now, found)
    return found


def _look_up(uid: int, gid: int | None) -> Person:
    try:
        entry = pwd.getpwuid(uid)
    except KeyError:
        raise UserError(f"uid {uid} has no entry in the user database") from None
    primary = entry.pw_gid if gid is None else gid
    groups = tuple(sorted(set(os.getgrouplist(entry.pw_name, primary))))
    return Person(uid, primary, entry.pw_name, groups, entry.pw_dir, entry.pw_shell)


def peer_credentials(sock: socket.socket) -> tuple[int, int, int]:
    """(pid, uid, gid) of the process that connected to `sock`, from the kernel."""
    raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _UCRED.size)
    pid, uid, gid = _UCRED.unpack(raw)
    return pid, uid, gid


def peer(sock: socket.socket) -> Person:
    """The person on the other end of a connected Unix socket."""
    _, uid, gid = peer_credentials(sock)
    return person(uid, gid)


def group_ids(names: Iterable[str]) -> frozenset[int]:
    """Group ids for configured group names; an unknown name is a configuration error."""
    ids = set()
    for name in names:
        try:
            ids.add(grp.getgrnam(name).gr_gid)
        except KeyError:
            raise UserError(f"[service] admins: no group named {name!r}") from None
    return frozenset(ids)


@dataclass(frozen=True)
class Admins:
    """Who may act on everyone's jobs and on the machine: root, the named users, and
    members of the named groups."""

    users: frozenset[str] = frozenset()
    groups: frozenset[int] = frozenset()

    def include(self, who: Person) -> bool:
        return who.is_root or who.name in self.users or bool(self.groups & set(who.groups))

    @classmethod
    def parse(cls, entries: Iterable[str]) -> Admins:
        """`["alice", "@gpuadmins"]`: a leading `@` names a group, as sudoers does."""
        users = {e for e in entries if not e.startswith("@")}
        groups = group_ids(e[1:] for e in entries if e.startswith("@"))
        return cls(frozenset(users), groups)
