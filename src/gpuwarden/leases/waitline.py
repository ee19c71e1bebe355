"""The line of clients waiting for GPUs on this machine, first come first served.

Each waiter keeps a ticket, `<key>.<n>.wait`, in the lease directory: its
request as JSON (`placement.requestwire`, the queue service's form of it, every
field checked when read back), locked by the waiter like lease metadata is, so a waiter
that is killed leaves the line by itself (the kernel drops the lock; the file
is ignored, then tidied). The key is the time of joining, so ticket order is
arrival order; `jobs.allocation.attempt` serves earlier waiters first. `n` is the number
of whole GPUs the waiter needs, so that a waiter far back in a long line can
tell from the names alone (one `listdir`) that it cannot be served yet.

Tickets live in the lease directory itself, not in a subdirectory: in a
shared sticky directory only a file's owner may remove it, whereas a
subdirectory's owner could remove everyone's tickets and jump the line.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import time
from collections.abc import Collection, Iterator
from typing import Any, Optional

from gpuwarden.base import records
from gpuwarden.base.errors import UserError
from gpuwarden.base.records import record
from gpuwarden.files.safefiles import (
    MAX_RECORD,
    UnsafeFile,
    open_regular,
    owner_name,
    printable,
    read_bounded,
    temporary_name,
    write_all,
)
from gpuwarden.leases import is_locked, needs, remove_if_free, warn

SUFFIX = ".wait"


@record
class Waiter:
    """One request waiting in line, as its ticket file says (the file's owner is the user)."""

    key: str  # arrival order
    user: str
    pid: int
    since: float  # time.time() it joined
    request: Any  # request.Request
    allowed: Optional[tuple[str, ...]] = None  # UUIDs its parent CUDA_VISIBLE_DEVICES leaves


# A ticket's key: the wall time it joined (ns, 20 digits), then the waiter's pid.
NAME_RE = re.compile(r"(\d{20})-(\d{8})\.(\d{1,4})" + re.escape(SUFFIX))

# A key may claim a time at most this much before the ticket was renamed into place
# (its ctime, set by the kernel: not a value the owner can choose). A crafted name
# with an early time cannot jump the line by more than this.
KEY_SLACK_NS = 10 * 10**9

# At most this many tickets are examined per look at the line (a directory everyone
# can write may hold any number); more are reported and left for later.
MAX_TICKETS = 1024


class Verdict:
    """What the kernel says about one ticket: `ok` (a live, running waiter that holds it
    and whose name, owner and contents fit), or why it is skipped; `dead` when nobody
    holds it any more (it may be removed)."""

    def __init__(self, ok: bool, why: str = "", dead: bool = False, uid: int = -1) -> None:
        self.ok = ok
        self.why = why
        self.dead = dead
        self.uid = uid


def check_ticket(
    ld: Any, name: str, key: str, pid: int, locks: Optional[dict[str, list[int]]] = None
) -> tuple[Verdict, bytes]:
    """Open a ticket safely (no FIFO, no symlink, bounded) and judge it by what the
    kernel says: who holds its lock (/proc/locks), whether that process is stopped,
    whom it runs as, when the file was put in place. (verdict, contents)."""
    from gpuwarden.leases import holders

    path = ld.join(name)
    try:
        fd, st = open_regular(path, what="ticket")
    except (OSError, UnsafeFile) as err:
        return Verdict(False, str(err)), b""
    try:
        if not is_locked(fd):
            return Verdict(False, "nobody holds it", dead=True, uid=st.st_uid), b""
        if not st.st_ctime_ns - KEY_SLACK_NS <= int(key[:20]) <= st.st_ctime_ns + KEY_SLACK_NS:
            return Verdict(False, "its name's time is not when it was made", uid=st.st_uid), b""
        if locks is not None:  # None: /proc/locks unreadable, the lock probe must do
            pids = holders.lock_pids(st.st_dev, st.st_ino, locks)
            if pid not in (pids or ()):
                return Verdict(False, "the pid in its name does not hold it", uid=st.st_uid), b""
        uid = holders.real_uid(pid)
        if uid is not None and uid != st.st_uid:
            return Verdict(False, "its owner is not its waiter's user", uid=st.st_uid), b""
        if holders.is_stopped(pid):
            return Verdict(False, "its waiter is stopped", uid=st.st_uid), b""
        if st.st_size > MAX_RECORD:
            return Verdict(False, "too large", uid=st.st_uid), b""
        try:
            raw = read_bounded(fd, MAX_RECORD)
        except (OSError, UnsafeFile) as err:
            return Verdict(False, str(err), uid=st.st_uid), b""
    finally:
        os.close(fd)
    return Verdict(True, uid=st.st_uid), raw


def _skip(ld: Any, name: str, verdict: Verdict) -> None:
    """Say once why a ticket is not counted (a stopped waiter: it keeps its place and is
    counted again when it resumes)."""

    who = f" of {owner_name(verdict.uid)}" if verdict.uid >= 0 else ""
    if verdict.why == "its waiter is stopped":
        warn(f"skipping a stopped waiter{who} in line ({printable(name)}) until it resumes")
    else:
        warn(f"ignoring ticket {printable(ld.join(name))}{who}: {verdict.why}")


class Ticket:
    """Our place in line; `leave()` (or dying) gives it up."""

    def __init__(self, ld: Any, key: str, path: str, fd: int) -> None:
        self.dir = ld
        self.key = key
        self.path = path
        self._fd: Optional[int] = fd
        self._ignored: set[str] = set()  # tickets ahead judged not to count, until rechecked

    def ahead(self) -> list[Waiter]:
        return [w for w in read_line(self.dir) if w.key < self.key]

    def scan(self, check_alive: bool = False, most: Optional[int] = None) -> tuple[int, int, int]:
        """(our place counting from 1, waiters in line, GPUs the waiters ahead need),
        from the ticket names; with `check_alive`, every ticket ahead is judged by the
        kernel (`check_ticket`): dead waiters' tickets are removed, and stopped waiters
        and tickets that do not fit are left out until the next check (neither must
        hold the line for everyone). A ticket for more than `most` GPUs (all there are)
        can never be served, so it does not count either."""
        from gpuwarden.leases import holders

        table: Optional[dict[str, list[int]]] = None
        loaded = False
        before = after = need = seen = 0
        if check_alive:
            self._ignored = set()
        for name in os.listdir(self.dir.path):
            parsed = _parse_name(name)
            if parsed is None or parsed[0] == self.key or name in self._ignored:
                continue
            key, n = parsed
            if most is not None and n > most:
                continue
            if key > self.key:
                after += 1
                continue
            seen += 1
            if seen > MAX_TICKETS:
                continue
            if check_alive:
                if not loaded:
                    table, loaded = holders.lock_table(), True
                verdict, _ = check_ticket(self.dir, name, key, int(key[21:]), table)
                if verdict.dead:
                    remove_if_free(self.dir.join(name))
                if not verdict.ok:
                    if not verdict.dead:
                        _skip(self.dir, name, verdict)
                    self._ignored.add(name)
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
    """(key, GPUs needed) from a ticket's file name; None for any other file, a name of
    another shape included (cheap: junk is ruled out by its name alone)."""
    if not name.endswith(SUFFIX):
        return None
    m = NAME_RE.fullmatch(name)
    if m is None or int(m.group(2)) <= 0:
        return None
    return f"{m.group(1)}-{m.group(2)}", int(m.group(3))


def join(
    ld: Any, request: Any, allowed: Optional[Collection[str]] = None, need: Optional[int] = None
) -> Ticket:
    """Take a place at the end of the line; `need` is how many whole GPUs we take (by
    default what the request needs; readers check that the two agree)."""

    from gpuwarden.placement.requestwire import to_wire

    need = needs(request) if need is None else need
    key = f"{time.time_ns():020d}-{os.getpid():08d}"
    data = {
        "pid": os.getpid(),
        "since": time.time(),
        "request": to_wire(request),
        # how the waiter ranks GPUs, which the wire leaves to the service
        "keep_first_last": request.keep_first_last,
        "allowed": None if allowed is None else sorted(allowed),
    }
    path = ld.join(f"{key}.{need}{SUFFIX}")
    tmp = temporary_name(path)
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        fd = os.open(tmp, flags, 0o644)
    except OSError as err:
        raise UserError(f"cannot join the line: cannot create {tmp}: {err.strerror}") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        write_all(fd, json.dumps(data).encode())
        os.rename(tmp, path)
    except BaseException as err:
        os.close(fd)
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        if isinstance(err, OSError):
            raise UserError(f"cannot join the line: {tmp}: {err.strerror}") from None
        raise
    return Ticket(ld, key, path, fd)


def read_line(ld: Any, tidy: bool = False) -> list[Waiter]:
    """Live waiters in arrival order; with `tidy`, tickets of dead waiters are removed."""
    return list(iter_line(ld, tidy=tidy))


def iter_line(ld: Any, before: Optional[str] = None, tidy: bool = False) -> Iterator[Waiter]:
    """Live, running waiters in arrival order, read one by one (a caller serving the
    line stops at the first that does not fit, without reading the rest); only those
    that joined before key `before` when given. A ticket is trusted only as far as the
    kernel vouches for it (`check_ticket`), and every field is checked; others are
    skipped and reported once."""
    from gpuwarden.leases import holders

    tickets = sorted((*p, n) for n in os.listdir(ld.path) for p in [_parse_name(n)] if p)
    if len(tickets) > MAX_TICKETS:
        warn(f"{len(tickets)} tickets in line in {ld.path}; looking at the first {MAX_TICKETS}")
        del tickets[MAX_TICKETS:]
    table = holders.lock_table() if tickets else None
    for key, need, name in tickets:
        if before is not None and key >= before:
            break
        pid = int(key[21:])
        verdict, raw = check_ticket(ld, name, key, pid, table)
        if not verdict.ok:
            if verdict.dead:
                if tidy:
                    remove_if_free(ld.join(name))
            else:
                _skip(ld, name, verdict)
            continue
        try:
            waiter = parse_ticket(raw, key, pid, need, owner_name(verdict.uid))
        except (ValueError, TypeError) as err:
            _skip(ld, name, Verdict(False, f"invalid ({err})", uid=verdict.uid))
            continue
        yield waiter


def parse_ticket(raw: bytes, key: str, pid: int, need: int, user: str) -> Waiter:
    """The waiter a ticket describes, every field checked against its type and against
    the name (pid, GPU count); ValueError or TypeError otherwise."""

    try:
        data = json.loads(raw)
    except RecursionError:
        raise ValueError("nested too deep") from None
    if not isinstance(data, dict):
        raise ValueError("not a JSON object")
    if data.get("pid") != pid:
        raise ValueError("its pid is not the one in its name")
    since = data.get("since")
    if not isinstance(since, (int, float)) or isinstance(since, bool) or not 0 < since < 2**40:
        raise ValueError("bad 'since'")
    allowed = data.get("allowed")
    if allowed is not None and not (
        isinstance(allowed, list) and all(isinstance(u, str) for u in allowed)
    ):
        raise ValueError("bad 'allowed'")
    if not isinstance(data.get("request"), dict):
        raise ValueError("bad 'request'")
    keep_first_last = data.get("keep_first_last", True)
    if not isinstance(keep_first_last, bool):
        raise ValueError("bad 'keep_first_last'")
    from gpuwarden.base.checked import ProtocolError
    from gpuwarden.placement.requestwire import from_wire

    try:
        # others=True: a field of another version's ticket is passed over, not fatal
        request = from_wire(data["request"], others=True)
    except ProtocolError as err:
        raise ValueError(str(err)) from None
    if not keep_first_last:
        request = records.replace(request, keep_first_last=False)
    if needs(request) != need:
        raise ValueError("its GPU count is not the one in its name")
    return Waiter(
        key=key,
        user=user,
        pid=pid,
        since=float(since),
        request=request,
        allowed=None if allowed is None else tuple(allowed),
    )
