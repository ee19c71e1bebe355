"""Leases: a held kernel `flock` on a per-GPU file (see docs/leases.md).

The kernel owns a lease. `<dir>/<uuid>.lock` is locked exclusively (a whole
GPU) or shared (`--mem`, a declared share) by the job, whose process tree
inherits the descriptor; the kernel drops the lock when the last holder exits,
SIGKILL included, so there is nothing to expire and nothing stale to clean.

Beside each lock, every holder keeps `<uuid>.<job>.lease`: its metadata
(pid, command, start, declared memory), itself locked by the holder. A
metadata file counts only while that lock is held, so one left behind by a
killed wrapper is ignored (and tidied later). It is written under a temporary
name, locked, then renamed into place, so a reader never sees it unlocked or
half written.

Choosing and taking is atomic among gpuwarden clients: `alloc.lock` is held
exclusively while the leases are read, `selection.choose` runs and the per-GPU
locks are taken, and until the new metadata is in place. Waiting clients
queue in the same directory (`gpuwarden.leases.waitline`) and are served first come,
first served.

The lease directory is checked before use (`gpuwarden.leases.dir`); choosing and
waiting in line are `gpuwarden.jobs.allocation`'s.

Every file in it may have been put there by a hostile user: records are opened
through `safefiles` (no FIFO, no link, bounded), every field is checked, a held
lease with a bad record still takes its GPU, and the allocation lock is waited
for with a deadline. See docs/leases.md, "A hostile local user".
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import time
from collections.abc import Sequence

from gpuwarden.base.errors import UserError
from gpuwarden.files.safefiles import (
    MAX_RECORD,
    TMP_SUFFIX,
    UnsafeFile,
    flock_within,
    open_regular,
    owner_name,
    printable,
    read_bounded,
    temporary_name,
    write_all,
)
from gpuwarden.leases.dir import Checked, LeaseDir, check_dir
from gpuwarden.leases.record import (
    HOLDER_PATTERN,
    HOLDER_SUFFIX,
    LeaseInfo,
    parse_record,
    unreadable,
)

TYPE_CHECKING = False  # typing stays off the start-up path; annotations need it only here
if TYPE_CHECKING:
    from typing import Any, Optional

    from gpuwarden.leases.spares import Spares

ALLOC = "alloc.lock"
LOCK_SUFFIX = ".lock"
PID_ROOM = 16  # spaces after a prepared record: room for the pid `publish` writes

# Without --wait, how long to try for the allocation lock before saying who holds it.
ALLOC_PATIENCE = 5.0

# Exit status for "not now": no GPU fits at the moment (without --wait), or the
# wait timed out. EX_TEMPFAIL from sysexits.h: "try again later".
EXIT_BUSY = 75


# --- reading leases --------------------------------------------------------------------------

# At most this many files named like lease metadata are read per listing: a directory
# that everyone can write may hold any number of them. Real leases are one per GPU and
# holder; beyond this, the per-GPU locks still keep exclusive leases apart.
MAX_RECORDS = 4096

# A wrapper or holder killed between creating and renaming its metadata leaves a
# temporary file; ours older than this are removed.
TMP_AGE = 600.0

_warned: set[str] = set()
MAX_WARNINGS = 20


def warn(message: str) -> None:
    """Report a problem with another user's file once per process, on one line: a record
    that is skipped is said so, and a long-running exporter does not repeat itself."""
    import sys

    if message in _warned or len(_warned) > MAX_WARNINGS:
        return
    _warned.add(message)
    if len(_warned) > MAX_WARNINGS:  # a directory full of junk must not flood a log
        message = "more problems in the lease directory; not reporting them"
    print(f"gpuwarden: warning: {message}", file=sys.stderr)


def is_locked(fd: int) -> bool:
    """True when some process holds a lock on the file; probes without keeping one."""
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    fcntl.flock(fd, fcntl.LOCK_UN)
    return False


def _read_holder(
    ld: LeaseDir, name: str, uuid: str, job: str, names: dict[int, str]
) -> tuple[Optional[LeaseInfo], bool]:
    """(lease, stale): the metadata when its holder still holds it; stale=True when nobody
    does and it is ours to tidy. A held file that is not a valid record counts as an
    exclusive lease by its owner (and is reported once). `names`: the owners' names the
    scan has looked up (one user database lookup a scan per owner, not per record)."""
    path = ld.join(name)
    try:
        fd, st = open_regular(path, what="lease record")
    except FileNotFoundError:
        return None, False
    except (OSError, UnsafeFile) as err:  # a FIFO, a device, a symlink, ...
        warn(f"skipping lease record {printable(path)}: {err}")
        return None, False
    try:
        owner = names.get(st.st_uid)
        if owner is None:
            owner = names[st.st_uid] = owner_name(st.st_uid)
        if ld.shared is False and st.st_uid not in (os.geteuid(), 0, ld.owner_uid):
            warn(
                f"skipping lease record {printable(path)}: owned by {owner} in a private directory"
            )
            return None, False
        if not is_locked(fd):
            return None, st.st_uid == os.geteuid() or os.geteuid() == 0
        try:
            if st.st_size > MAX_RECORD:
                raise UnsafeFile(f"{st.st_size} bytes")
            info = parse_record(
                read_bounded(fd, MAX_RECORD), uuid, job, owner, by_root=st.st_uid == 0
            )
        except (OSError, ValueError, UnsafeFile) as err:
            warn(
                f"lease record {printable(path)} of {owner} is invalid ({err}); counting "
                "its GPU as taken"
            )
            return unreadable(uuid, owner, "invalid record"), False
    finally:
        os.close(fd)
    return info, False


def scan(
    ld: LeaseDir, line: Optional[list[bool]] = None, tidy: Optional[list[str]] = None
) -> tuple[list[LeaseInfo], list[str]]:
    """Live leases and stale metadata names; `line` (if given) gets True appended when
    anyone is waiting in line, so that an empty line costs nothing more. Names are
    judged before anything is opened (junk costs a string test); with `tidy` (a list),
    our own temporary files are collected into it for `sweep` (not this process's:
    it is using them, as the service its record files made ahead, leases.spares)."""
    leases, stale = [], []
    read = 0
    names: dict[int, str] = {}
    ours = f".{os.getpid()}-"  # this process's own temporary files are in use
    for name in os.listdir(ld.path):
        if not name.endswith(HOLDER_SUFFIX):
            if name.endswith(".wait"):
                if line is not None and not line:
                    line.append(True)
            elif tidy is not None and name[:1] == "." and name.endswith(TMP_SUFFIX):
                tidy += [] if ours in name else [name]  # ours are in use: left alone
            continue
        m = re.fullmatch(HOLDER_PATTERN, name)
        if m is None:
            continue
        read += 1
        if read > MAX_RECORDS:
            warn(
                f"lease directory {ld.path} holds more than {MAX_RECORDS} lease records; "
                "read the first ones only (someone may be filling it with junk)"
            )
            break
        info, dead = _read_holder(ld, name, m.group(1), m.group(2), names)
        if info is not None:
            leases.append(info)
        elif dead:
            stale.append(name)
    leases.sort(key=lambda i: (i.uuid, i.job or ""))
    return leases, stale


def list_leases(
    lease_dir: Optional[str] = None, checked: Optional[Checked] = None
) -> list[LeaseInfo]:
    """Leases that are held right now (lock actually held by a live holder). `checked`:
    a long-lived process's lease directories, checked again only when they change."""
    if lease_dir is None:
        from gpuwarden.files.locations import lease_location

        lease_dir = lease_location()
    if not os.path.lexists(lease_dir):
        return []
    path = os.path.abspath(lease_dir)
    return scan(check_dir(path) if checked is None else checked.open(path, create=False))[0]


def tidy(ld: LeaseDir, names: Sequence[str]) -> None:
    """Remove metadata nobody holds any more. Only a holder-less file is removed, while
    we hold its lock, so a live lease is never touched."""
    for name in names:
        remove_if_free(ld.join(name))


def sweep(ld: LeaseDir, names: Sequence[str]) -> None:
    """Remove our temporary files (`names`, from `scan`) left by a writer killed before
    its rename: only old ones, and only when no one holds them locked."""
    now = time.time()
    for name in names:
        path = ld.join(name)
        try:
            st = os.lstat(path)
        except OSError:
            continue
        if st.st_uid == os.geteuid() and now - st.st_mtime > TMP_AGE:
            remove_if_free(path)


def remove_if_free(path: str) -> bool:
    try:
        fd, _ = open_regular(path)
    except (OSError, UnsafeFile):
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        os.unlink(path)
        return True
    except OSError:  # still held, already gone, or someone else's in a sticky directory
        return False
    finally:
        os.close(fd)


# --- holding leases --------------------------------------------------------------------------


class Held:
    """GPUs this process holds leases on. `fds` must reach the job (inherited); the
    metadata appears when `publish()` names the job's pid, and the allocation lock is
    held until then, so no other client sees a taken GPU without its metadata."""

    def __init__(self, ld: LeaseDir, job: str, gpus: tuple[Any, ...], mem: Optional[int]):
        self.dir = ld
        self.job = job
        self.gpus = gpus
        self.mem = mem
        self.fds: list[int] = []  # lock and metadata descriptors: what the job inherits
        self._tmp: list[tuple[int, str, str, Any]] = []  # (fd, tmp path, final path, gpu)
        self._final: list[str] = []
        self._published: list[tuple[int, dict[str, Any]]] = []  # (record fd, its contents)
        self._records: Optional[list[dict[str, Any]]] = None  # prepared, not yet published
        self._alloc_fd: Optional[int] = None
        self.on_behalf: Optional[str] = None  # root leasing for this user (the queue service)
        self.spares: Optional[Spares] = None  # record files made ahead (leases.spares)

    @property
    def uuids(self) -> tuple[str, ...]:
        return tuple(g.uuid for g in self.gpus)

    def prepare(
        self,
        command: str,
        started: Optional[float] = None,
        expires: Optional[float] = None,
    ) -> None:
        """Write the metadata, still under its temporary name, before the job starts: the
        disk space it needs is taken now, so a full disk fails here (one line, nothing
        started, nothing left behind) and `publish` only fills in the pid in place."""
        started = time.time() if started is None else started
        self._records = []
        for fd, tmp, _final, gpu in self._tmp:
            meta = {
                "uuid": gpu.uuid,
                "index": gpu.index,
                "pid": 0,
                "command": command[:500],
                "started": started,
                "mem": self.mem,
                "job": self.job,
                "expires": expires,
                **({"user": self.on_behalf} if self.on_behalf else {}),
            }
            # Room for any pid: publish rewrites these bytes, never more.
            raw = json.dumps(meta).encode() + b" " * PID_ROOM
            try:
                write_all(fd, raw)
            except OSError as err:
                raise UserError(
                    f"cannot write the lease record {tmp}: {err.strerror}; nothing was started"
                ) from None
            self._records.append(meta)

    def publish(
        self,
        pid: int,
        command: Optional[str] = None,
        started: Optional[float] = None,
        expires: Optional[float] = None,
    ) -> None:
        """Name the job's pid in the metadata and move it to its final name, then let
        other clients allocate. Without `prepare` first, prepares with `command`."""
        try:
            if self._records is None:
                self.prepare(command or "", started, expires)
            assert self._records is not None
            for (fd, tmp, final, _gpu), meta in zip(self._tmp, self._records):
                raw = json.dumps({**meta, "pid": pid}).encode()
                size = os.fstat(fd).st_size
                try:
                    os.pwrite(fd, raw.ljust(size), 0)
                    os.rename(tmp, final)
                except OSError as err:
                    raise UserError(
                        f"cannot publish the lease record {final}: {err.strerror}"
                    ) from None
                self._final.append(final)
                self._published.append((fd, {**meta, "pid": pid}))
            self._tmp = []
            self._records = None
        finally:
            self.unlock_allocation()

    def repoint(self, pid: int) -> None:
        """Name another pid as the published lease's job, in place (the lease is not let
        go in between): a restarted notebook kernel keeps its GPUs under its new pid."""
        for fd, meta in self._published:
            meta["pid"] = pid
            raw = json.dumps(meta).encode()
            size = os.fstat(fd).st_size
            if len(raw) > size:
                raise UserError("the lease record has no room for the new pid")
            try:
                os.pwrite(fd, raw.ljust(size), 0)
            except OSError as err:
                raise UserError(f"cannot update the lease record: {err.strerror}") from None

    def take(self, gpu: Any, shared: bool) -> bool:
        """Lock one GPU for this job; False when someone holds it in a conflicting mode.
        Its metadata is created under a temporary name, locked, for `prepare`/`publish`."""
        ld = self.dir
        fd = ld.open(gpu.uuid + LOCK_SUFFIX, os.O_RDONLY | os.O_CREAT)
        try:
            fcntl.flock(fd, (fcntl.LOCK_SH if shared else fcntl.LOCK_EX) | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return False
        self.fds.append(fd)
        final = ld.join(f"{gpu.uuid}.{self.job}{HOLDER_SUFFIX}")
        made = None if self.spares is None else self.spares.take(ld)  # leases.spares
        if made is not None:
            mfd, tmp = made
        else:
            tmp = temporary_name(final)  # swept by `sweep` if we are killed before the rename
            flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
            try:
                mfd = os.open(tmp, flags, 0o644)
            except OSError as err:
                raise UserError(f"cannot create the lease record {tmp}: {err.strerror}") from None
            fcntl.flock(mfd, fcntl.LOCK_EX)
        self.fds.append(mfd)
        self._tmp.append((mfd, tmp, final, gpu))
        return True

    def keep_allocation_lock(self, fd: int) -> None:
        """Hold the allocation lock (descriptor `fd`, now ours to close) until `publish`:
        no other client may see these GPUs taken without their metadata."""
        self.drop_allocation_lock()
        self._alloc_fd = fd

    def unlock_allocation(self) -> None:
        """Let other clients allocate now, though a child forked meanwhile (a job's
        supervisor, a reservation holder) still has a copy of the lock's descriptor: a
        copy keeps a flock until the last one is closed, an unlock ends it for all."""
        if self._alloc_fd is not None:
            fcntl.flock(self._alloc_fd, fcntl.LOCK_UN)
        self.drop_allocation_lock()

    def drop_allocation_lock(self) -> None:
        """Let other clients allocate; a forked holder drops its copy of the lock."""
        if self._alloc_fd is not None:
            os.close(self._alloc_fd)
            self._alloc_fd = None

    def close(self) -> None:
        """Drop this process's descriptors; the lease lives on in any child holding them."""
        self.drop_allocation_lock()
        for fd in self.fds:
            try:
                os.close(fd)
            except OSError:
                pass
        self.fds = []

    def release(self) -> None:
        """Drop our descriptors and remove the metadata if no one else (a job's leftover
        children) still holds it. Also right in a forked copy made before `publish()`
        (the reservation holder): the metadata its parent published is removed too."""
        self.close()
        for _, tmp, final, _ in self._tmp:
            try:
                os.unlink(tmp)
            except OSError:
                pass
            remove_if_free(final)  # unique to this job; absent unless published meanwhile
        self._tmp = []
        self._records = None
        for final in self._final:
            remove_if_free(final)
        self._final = []
        self._published = []

    def __enter__(self) -> Held:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def new_job_id() -> str:
    return f"{os.getpid()}-{os.urandom(3).hex()}"


def lease_exactly(
    ld: LeaseDir, gpus: Sequence[Any], job: str, *, shared: bool = False, patience: float
) -> Optional[Held]:
    """Lease exactly `gpus` for `job` (someone else chose them: Slurm, say), taking the
    allocation lock for at most `patience` seconds (AllocationBusy otherwise). None,
    with nothing held, when any of them is leased in a conflicting mode. On success the
    allocation lock stays held until `Held.publish()`."""
    alloc_fd = ld.open(ALLOC, os.O_RDONLY | os.O_CREAT)
    try:
        lock_within(alloc_fd, patience, ld.join(ALLOC))
        held = Held(ld, job, (), None)
        try:
            if not all(held.take(g, shared) for g in gpus):
                held.release()
                return None
        except BaseException:
            held.release()
            raise
        held.gpus = tuple(gpus)
        held.keep_allocation_lock(alloc_fd)
        alloc_fd = -1
        return held
    finally:
        if alloc_fd >= 0:
            os.close(alloc_fd)


class AllocationBusy(UserError):
    """The allocation lock stayed held longer than we were willing to wait."""


def lock_within(fd: int, patience: float, path: str) -> None:
    """Take an exclusive flock on `fd`, polling, for at most `patience` seconds: a lock
    held by a stopped or hostile process must not stop every client (a blocking flock
    cannot be given a timeout)."""
    if not flock_within(fd, patience):
        raise AllocationBusy(
            f"{path} is held by {lock_holder(fd)}; gpuwarden clients take it for "
            "milliseconds, so that process is stopped, stuck or hostile (a directory "
            "every user can write cannot be protected from a user who holds its locks)",
            exit_code=EXIT_BUSY,
        )


def lock_holder(fd: int) -> str:
    """Who holds the lock on `fd`, from /proc/locks (the kernel), for messages."""
    from gpuwarden.leases import holders

    st = os.fstat(fd)
    pids = holders.lock_pids(st.st_dev, st.st_ino)
    if not pids:
        return f"another process (file owner {owner_name(st.st_uid)})"
    return ", ".join(holders.describe(pid) for pid in sorted(set(pids)))


def needs(request: Any) -> int:
    """Whole GPUs a request takes (0 for a shared one): what the line's cheap check adds."""
    return 0 if request.mem is not None else request.gpu_count
