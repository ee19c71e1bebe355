"""The line of clients waiting for GPUs on this machine, first come first served.

Each waiter keeps a ticket, `<key>.<n>.wait`, in the lease directory: its
request as JSON, locked by the waiter like lease metadata is, so a waiter
that is killed leaves the line by itself (the kernel drops the lock; the file
is ignored, then tidied). The key is the time of joining, so ticket order is
arrival order; `lease.attempt` serves earlier waiters first. `n` is the number
of whole GPUs the waiter needs, so that a waiter far back in a long line can
tell from the names alone (one `listdir`) that it cannot be served yet.

Tickets live in the lease directory itself, not in a subdirectory: in a
shared sticky directory only a file's owner may remove it, whereas a
subdirectory's owner could remove everyone's tickets and jump the line.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import json
import os
import time
from collections.abc import Collection, Iterator
from typing import Any, Optional

from gpuwarden.records import record

SUFFIX = ".wait"


@record
class Waiter:
    key: str  # arrival order
    user: str
    pid: int
    since: float  # time.time() it joined
    request: Any  # selection.Request
    allowed: Optional[tuple[str, ...]] = None  # UUIDs its parent CUDA_VISIBLE_DEVICES leaves


def _request_from(data: dict[str, Any]) -> Any:
    from gpuwarden.selection import Request

    names = {f.name for f in dataclasses.fields(Request)}
    fields = {k: tuple(v) if isinstance(v, list) else v for k, v in data.items() if k in names}
    return Request(**fields)


class Ticket:
    """Our place in line; `leave()` (or dying) gives it up."""

    def __init__(self, ld: Any, key: str, path: str, fd: int) -> None:
        self.dir = ld
        self.key = key
        self.path = path
        self._fd: Optional[int] = fd

    def ahead(self) -> list[Waiter]:
        return [w for w in read_line(self.dir) if w.key < self.key]

    def scan(self, check_alive: bool = False) -> tuple[int, int, int]:
        """(our place counting from 1, waiters in line, GPUs the waiters ahead need),
        from the ticket names; with `check_alive`, tickets ahead whose waiter died are
        removed first (a dead waiter must not hold the line)."""
        from gpuwarden.leases import is_locked, remove_if_free

        before = after = need = 0
        for name in os.listdir(self.dir.path):
            parsed = _parse_name(name)
            if parsed is None or parsed[0] == self.key:
                continue
            key, n = parsed
            if key > self.key:
                after += 1
                continue
            if check_alive:
                path = self.dir.join(name)
                try:
                    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
                except OSError:
                    continue
                try:
                    alive = is_locked(fd)
                finally:
                    os.close(fd)
                if not alive:
                    remove_if_free(path)
                    continue
            before += 1
            need += n
        return before + 1, before + 1 + after, need

    def leave(self) -> None:
        if self._fd is None:
            return
        with contextlib.suppress(OSError):
            os.unlink(self.path)
        os.close(self._fd)
        self._fd = None


def _parse_name(name: str) -> Optional[tuple[str, int]]:
    """(key, GPUs needed) from a ticket's file name; None for any other file."""
    if not name.endswith(SUFFIX) or name.startswith("."):
        return None
    key, _, need = name[: -len(SUFFIX)].rpartition(".")
    if not key or not need.isdigit():
        return None
    return key, int(need)


def join(ld: Any, request: Any, allowed: Optional[Collection[str]] = None, need: int = 1) -> Ticket:
    """Take a place at the end of the line; `need` is how many whole GPUs we take."""
    from gpuwarden.leases import TMP_PREFIX

    key = f"{time.time_ns():020d}-{os.getpid():08d}"
    data = {
        "pid": os.getpid(),
        "since": time.time(),
        "request": dataclasses.asdict(request),
        "allowed": None if allowed is None else sorted(allowed),
    }
    tmp = ld.join(f"{TMP_PREFIX}{key}{SUFFIX}")
    path = ld.join(f"{key}.{need}{SUFFIX}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        os.write(fd, json.dumps(data).encode())
        os.rename(tmp, path)
    except BaseException:
        os.close(fd)
        os.unlink(tmp)
        raise
    return Ticket(ld, key, path, fd)


def read_line(ld: Any, tidy: bool = False) -> list[Waiter]:
    """Live waiters in arrival order; with `tidy`, tickets of dead waiters are removed."""
    return list(iter_line(ld, tidy=tidy))


def iter_line(ld: Any, before: Optional[str] = None, tidy: bool = False) -> Iterator[Waiter]:
    """Live waiters in arrival order, read one by one (a caller serving the line stops
    at the first that does not fit, without reading the rest); only those that joined
    before key `before` when given."""
    from gpuwarden.leases import is_locked, owner_of, remove_if_free

    tickets = sorted((*p, n) for n in os.listdir(ld.path) for p in [_parse_name(n)] if p)
    for key, _, name in tickets:
        if before is not None and key >= before:
            break
        parsed = (key,)
        path = ld.join(name)
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            continue
        try:
            if not is_locked(fd):
                if tidy:
                    remove_if_free(path)
                continue
            raw = os.read(fd, 1 << 16)
            uid = os.fstat(fd).st_uid
        finally:
            os.close(fd)
        try:
            data = json.loads(raw)
            allowed = data.get("allowed")
            waiter = Waiter(
                key=parsed[0],
                user=owner_of(uid),
                pid=int(data["pid"]),
                since=float(data["since"]),
                request=_request_from(data["request"]),
                allowed=None if allowed is None else tuple(allowed),
            )
        except (ValueError, KeyError, TypeError):
            continue
        yield waiter
