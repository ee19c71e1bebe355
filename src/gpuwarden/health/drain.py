"""Drains: GPUs taken out of service with a reason, persisted and keyed by UUID.

Each drain is its own small JSON file, `drain.<UUID>.json`, in the state
directory (`gpuwarden.files.locations.state_location()`). One file per drain, owned by the
person who drained, lets the kernel enforce the rule "only the person who
drained or root may undrain" in the shared system directory: it is sticky, so
nobody else can delete or replace that file. The tool checks the same rule
first so the refusal is a clear line rather than EPERM.

Who drained comes from the kernel (the file's owner), never from the file: any
user can write any text into a file of their own. Every field read back is
validated, and text from other users is escaped for the terminal once, here, so
every display (`drain`, `health`, `status`, `select`, `doctor`) shows it safely.

Writes are atomic (`safefiles.write_atomic`: a temporary file of a name nobody
else can guess, fsync, rename, fsync of the directory) and serialised by an
flock on `drains.lock`, so a reader never sees half a record and two people
draining at once do not lose either reason. The lock is waited for with a
timeout, and a lock held too long is an error naming its holder; root waits
`ROOT_LOCK_WAIT` at most, then goes on without it (the write is atomic), so a
user holding the lock cannot stop root. In a shared directory only root and the
admins (`service.admins`) may drain at all (`_refused_here`). Readers take
no lock, open nothing that is not a regular file and read a bounded size.
A record that cannot be read or is not valid still counts as a drain: a GPU is
never put back into service by a corrupt or hostile file.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator, Sequence

from gpuwarden.base.errors import UserError
from gpuwarden.base.records import record
from gpuwarden.files.safefiles import MAX_RECORD, UnsafeFile, printable, read_small
from gpuwarden.files.safefiles import owner_name as _owner

TYPE_CHECKING = False  # typing stays off the start-up path; annotations need it only here
if TYPE_CHECKING:
    from contextlib import AbstractContextManager
    from typing import Optional, Union

    PathLike = Union[str, "os.PathLike[str]"]

PREFIX, SUFFIX = "drain.", ".json"
LOCK_NAME = "drains.lock"
#: How long a drain or undrain waits for another one's lock before it gives up.
LOCK_TIMEOUT = 10.0
#: Longest reason kept; the rest is cut (a reason is one line for people to read).
MAX_REASON = 500
#: Temporary files of killed writers older than this are removed by the next writer.
STALE_TEMPORARY = 600.0


class DrainLockBusy(UserError):
    """`drains.lock` stayed held longer than the timeout; the message names the holder."""


#: The name the health watch drains under (its records' `by`).
HEALTH_WATCH = "gpuwarden-health"


@record
class Drain:
    """A GPU out of service: who took it out, when and why (one file on disk).

    `by` is the login name of the record's owner as the kernel reports it, and
    `reason` is escaped for printing (`safefiles.printable`)."""

    uuid: str
    reason: str
    by: str  # owner of the record (its st_uid), as a login name
    at: float  # time.time()
    auto: bool = False  # set by the health watch rather than a person
    uid: Optional[int] = None  # owner of the record: who may undrain (with root)

    @property
    def who(self) -> str:
        """`by`, saying when the health watch (rather than a person) drained."""
        return f"{self.by} (health watch)" if self.auto else self.by

    @property
    def drainer(self) -> str:
        """Who drained, in one word (the exporter's `by` label): `gpuwarden-health` for
        the health watch running as root (the service's, the exporter's), else the
        record's owner. `auto` is the record's own word, so only a record root owns
        passes for the watch; a user's own watch shows as that user (`auto` says it)."""
        return HEALTH_WATCH if self.auto and self.uid == 0 else self.by


def _directory(directory: Optional[PathLike]) -> str:
    # Strings, not Paths: `status` and `run` list the drains, and pathlib stays off
    # their start-up path.
    if directory is not None:
        return os.fspath(directory)
    from gpuwarden.files.locations import state_location

    return state_location()


def _record_path(directory: str, uuid: str) -> str:
    if not uuid or not uuid.strip() or "/" in uuid or uuid.startswith("."):
        raise UserError(f"invalid GPU UUID {printable(repr(uuid))}")
    return os.path.join(directory, f"{PREFIX}{uuid}{SUFFIX}")


def _fields(data: object) -> tuple[str, float, bool]:
    """(reason, at, auto) of a record's JSON, or ValueError saying which field is wrong.
    `by`, `uid` and `uuid` in the file are ignored: the owner and the name say those."""
    if not isinstance(data, dict):
        raise ValueError("not a JSON object")
    reason = data.get("reason")
    if not isinstance(reason, str) or not reason.strip():
        raise ValueError("field 'reason' is not a non-empty string")
    at = data.get("at")
    if isinstance(at, bool) or not isinstance(at, (int, float)):
        raise ValueError("field 'at' is not a number")
    try:
        at = float(at)
    except OverflowError:
        raise ValueError("field 'at' is not a time") from None
    if not 0 <= at < float("inf"):  # NaN compares false too
        raise ValueError("field 'at' is not a time")
    auto = data.get("auto", False)
    if not isinstance(auto, bool):
        raise ValueError("field 'auto' is not true or false")
    reason = reason.strip()
    if len(reason) > MAX_REASON:
        reason = reason[:MAX_REASON] + "..."
    return reason, at, auto


def _read(path: str) -> Optional[Drain]:
    """The drain recorded at `path`; an unreadable or invalid record is a drain too
    (fail safe), with the reason saying so and naming the file's owner. None when
    the file vanished meanwhile (an undrain)."""
    uuid = os.path.basename(path)[len(PREFIX) : -len(SUFFIX)]
    st: Optional[os.stat_result] = None
    try:
        raw, st = read_small(path, MAX_RECORD, what="drain record")
        reason, at, auto = _fields(json.loads(raw.decode("utf-8")))
    except FileNotFoundError:
        return None
    except (UnsafeFile, OSError, ValueError, OverflowError, RecursionError) as err:
        if st is None:
            try:
                st = os.lstat(path)
            except OSError:
                pass
        uid = None if st is None else st.st_uid
        why = getattr(err, "strerror", None) or str(err)
        why = why.replace(f" {path}", "")  # the path is said once, below
        reason = f"unreadable drain record {path} (owner {_owner(uid)}): {why}"
        at = 0.0 if st is None else st.st_mtime
        return Drain(uuid, printable(reason), _owner(uid), at, False, uid)
    return Drain(uuid, printable(reason), _owner(st.st_uid), at, auto, st.st_uid)


def list_drains(directory: Optional[PathLike] = None) -> dict[str, Drain]:
    """Current drains by UUID (empty when the state directory does not exist yet)."""
    where = _directory(directory)
    try:
        names = os.listdir(where)
    except (FileNotFoundError, NotADirectoryError):
        return {}
    except OSError as err:
        raise UserError(f"cannot read drains in {where}: {err.strerror}") from None
    drains = {}
    for name in sorted(names):
        if name.startswith(PREFIX) and name.endswith(SUFFIX) and len(name) > 11:
            found = _read(os.path.join(where, name))
            if found is not None:
                drains[found.uuid] = found
    return drains


def lock_holder(path: str, st: os.stat_result) -> str:
    """Who holds a lock on the file `path` (fstat `st`), from /proc/locks: "pid 12 (flock,
    user alice)", or "" when it cannot tell (another PID namespace, no /proc)."""
    want = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
    try:
        raw, _ = read_small("/proc/locks", 4 << 20, what="lock table")
    except (OSError, UserError):
        return ""
    for line in raw.decode("ascii", "replace").splitlines():
        parts = line.split()
        # "1: FLOCK  ADVISORY  WRITE 1234 08:01:5678 0 EOF" ("->" marks a waiter)
        if "->" in parts or len(parts) < 6 or parts[5] != want:
            continue
        pid = parts[4]
        try:
            uid = os.stat(f"/proc/{pid}").st_uid
            with open(f"/proc/{pid}/comm", encoding="utf-8", errors="replace") as fh:
                comm = fh.read(64).strip()
        except OSError:
            return f"pid {pid}"
        return f"pid {pid} ({printable(comm)}, user {_owner(uid)})"
    return ""


def _locked(
    directory: str, timeout: float = LOCK_TIMEOUT, force: bool = False
) -> AbstractContextManager[bool]:
    """Hold `drains.lock` in `directory`; gives whether the lock is held. After
    `timeout` seconds of someone else holding it, raise DrainLockBusy naming the
    holder, or with `force` go on without it (see `drain`). contextlib is imported
    here, by those who change drains: `gpuwarden run` only reads them."""
    from contextlib import contextmanager

    return contextmanager(_holding)(directory, timeout, force)


def _holding(directory: str, timeout: float, force: bool) -> Iterator[bool]:
    import fcntl

    from gpuwarden.files.paths import ensure_dir
    from gpuwarden.files.safefiles import open_regular

    ensure_dir(directory, "state directory")
    path = os.path.join(directory, LOCK_NAME)
    # Read-only is enough for flock, and lets every user of a shared directory lock
    # a file that its first user created. open_regular: a FIFO or a symlink to a
    # device planted under the lock's name is refused, not waited on.
    try:
        try:
            fd, st = open_regular(path, os.O_RDONLY | os.O_CREAT, 0o644, what="drain lock")
        except UnsafeFile:
            if os.geteuid() != 0 or os.path.isdir(path):
                raise
            os.unlink(path)  # root takes back a FIFO or symlink planted as the lock
            fd, st = open_regular(path, os.O_RDONLY | os.O_CREAT, 0o644, what="drain lock")
    except UnsafeFile:
        if not force:
            raise
        yield False
        return
    except PermissionError as err:
        if os.geteuid() != 0 and _roots(directory):
            # Root's 0755 state directory: a machine run by the queue service, where
            # only admins (root) drain, as in Slurm's `scontrol update state=drain`.
            raise UserError(
                f"only an admin may drain or undrain GPUs on this machine (its state "
                f"directory {directory} is root's): ask one, e.g. `sudo gpuwarden drain ...`"
            ) from None
        raise UserError(f"cannot open the drain lock {path}: {err.strerror}") from None
    except OSError as err:
        raise UserError(f"cannot open the drain lock {path}: {err.strerror}") from None
    try:
        deadline = time.monotonic() + timeout
        held = True
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    if force:
                        held = False
                        break
                    holder = lock_holder(path, st) or "another process"
                    raise DrainLockBusy(
                        f"drains are locked: {path} has been held by {holder} for more than "
                        f"{timeout:g}s (try again; if it stays held, ask that user or root)"
                    ) from None
                time.sleep(0.05)
        yield held
    finally:
        os.close(fd)


#: How long root waits for `drains.lock` before going on without it: only root and
#: admins may drain in a shared directory, so anyone else holding the lock is in the way.
ROOT_LOCK_WAIT = 2.0


def _refused_here(where: str, admins: Sequence[str]) -> Optional[str]:
    """Why this user may not change drains in `where`, or None. In a shared directory
    (sticky and world-writable, as an admin sets /var/lib/gpuwarden/state up) only
    root and the `admins` (`service.admins` of the caller's reading: names, `@group`s)
    may: a drain takes a GPU from everyone. A private directory is its owner's."""
    if os.geteuid() == 0:
        return None
    try:
        mode = os.stat(where).st_mode
    except OSError:
        return None  # made private below, by ensure_dir
    if not (mode & 0o002 and mode & 0o1000):
        return None
    from gpuwarden.files.paths import user_name

    me = user_name(os.geteuid())
    if me in admins or _in_a_group(a[1:] for a in admins if a.startswith("@")):
        return None
    return (
        f"only root or an admin (service.admins) may drain or undrain GPUs in the shared "
        f"directory {where}"
    )


def _in_a_group(names: Iterator[str]) -> bool:
    import grp

    mine = set(os.getgroups()) | {os.getegid()}
    for name in names:
        try:
            if grp.getgrnam(name).gr_gid in mine:
                return True
        except KeyError:
            continue
    return False


def _may_change(found: Drain) -> bool:
    return os.getuid() == 0 or found.uid is None or found.uid == os.getuid()


def drain(
    uuid: str,
    reason: str,
    *,
    by: str | None = None,
    auto: bool = False,
    directory: Optional[PathLike] = None,
    lock_timeout: float = LOCK_TIMEOUT,
    force: bool = False,
    admins: Sequence[str] = (),
) -> Drain:
    """Take `uuid` out of service. Draining again updates the reason; a GPU drained
    by someone else raises UserError (only they or root may change it).

    `by` is only written into the record for people reading the file; readers take
    the owner from the kernel. With `force` (the health watch), a lock held by
    someone else for more than `lock_timeout` seconds does not stop the drain: the
    write is atomic, and the sticky directory already keeps anyone but the owner
    and root from replacing a record, so the lock only orders two changes at once.
    `admins` (`service.admins`) may drain in a shared directory besides root."""
    from gpuwarden.files.safefiles import sweep_temporaries, write_atomic

    if not reason or not reason.strip():
        raise UserError("a drain needs a reason (--reason TEXT), so others know why")
    where = _directory(directory)
    path = _record_path(where, uuid)
    text = reason.strip()
    if len(text) > MAX_REASON:
        raise UserError(f"a drain reason is at most {MAX_REASON} characters")
    refused = _refused_here(where, admins)
    if refused is not None:
        raise UserError(refused)
    if os.geteuid() == 0:  # nobody else may hold the lock for long (ROOT_LOCK_WAIT)
        force, lock_timeout = True, min(lock_timeout, ROOT_LOCK_WAIT)
    me = os.getuid()
    made = Drain(uuid, printable(text), _owner(me), time.time(), auto, me)
    with _locked(where, lock_timeout, force):
        if os.path.lexists(path):
            old = _read(path)
            if old is not None and not _may_change(old):
                raise UserError(
                    f"{printable(uuid)} is already drained by {old.by}: {old.reason} "
                    f"(only {old.by} or root may change it)"
                )
            if old is not None and old.reason.startswith("unreadable drain record"):
                # Not a record of ours (a FIFO, a directory): rename cannot replace
                # every kind of file, so remove it first; we own it, or are root.
                try:
                    os.unlink(path)
                except OSError:
                    pass
        body = {
            "uuid": uuid,
            "reason": text,
            "by": by or made.by,
            "at": made.at,
            "auto": auto,
            "uid": me,
        }
        write_atomic(path, json.dumps(body, indent=1) + "\n", what="drain record")
        sweep_temporaries(where, STALE_TEMPORARY)
    return made


def undrain(
    uuid: str,
    *,
    by: str | None = None,
    directory: Optional[PathLike] = None,
    lock_timeout: float = LOCK_TIMEOUT,
    admins: Sequence[str] = (),
) -> None:
    """Put `uuid` back into service. Raises UserError if it is not drained, or was
    drained by someone else and the caller is not root (`admins`: as for `drain`)."""
    from gpuwarden.files.safefiles import sweep_temporaries, sync_directory

    where = _directory(directory)
    path = _record_path(where, uuid)
    refused = _refused_here(where, admins)
    if refused is not None:
        raise UserError(refused)
    force = os.geteuid() == 0  # as for `drain`: root waits ROOT_LOCK_WAIT at most
    with _locked(where, min(lock_timeout, ROOT_LOCK_WAIT) if force else lock_timeout, force):
        old = _read(path) if os.path.lexists(path) else None
        if old is None:
            raise UserError(f"{printable(uuid)} is not drained")
        if not _may_change(old):
            raise UserError(
                f"{printable(uuid)} was drained by {old.by} ({old.reason}); only {old.by} or "
                "root may undrain it"
            )
        try:
            if os.path.isdir(path) and not os.path.islink(path):
                os.rmdir(path)
            else:
                os.unlink(path)
        except OSError as err:
            raise UserError(f"cannot remove drain record {path}: {err.strerror}") from None
        sync_directory(where)
        sweep_temporaries(where, STALE_TEMPORARY)


def _roots(directory: str) -> bool:
    """Whether `directory` is root's and closed to us (the queue service's layout)."""
    try:
        return os.stat(directory).st_uid == 0 and not os.access(directory, os.W_OK)
    except OSError:
        return False
