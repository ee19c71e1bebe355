"""Who holds a lock, and may that process be signalled: asked of the kernel, never of a file.

The lease directory is shared with every local user, so a pid written in a lease or
ticket proves nothing: anyone can write any number there. What the kernel says can
be trusted: `/proc/locks` lists the pid that took each `flock`, `/proc/PID/stat`
whether that process is stopped, `/proc/PID/fd` which files it holds open, and
`/proc/PID/status` whom it runs as. Everything here answers None or False when the
kernel does not say (no /proc, another user's process we may not inspect), so that
a caller refuses rather than guesses.
"""

from __future__ import annotations

import os
import signal

from gpuwarden.base.units import is_digits

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Optional

PROC = "/proc"

# States in /proc/PID/stat that mean "not running and will not run until someone
# acts": stopped by a signal (Ctrl-Z) or by a tracer, a zombie, dead.
STOPPED = frozenset("Tt")
GONE = frozenset("ZXx")


def lock_table(locks: str = PROC + "/locks") -> Optional[dict[str, list[int]]]:
    """Every held (not awaited) lock on the machine, as "MAJ:MIN:INODE" -> pids, from
    /proc/locks; None when it cannot be read. Read once per look at the line: it lists
    every lock on the machine. A pid of 0 (a holder in another pid namespace) is left out."""
    table: dict[str, list[int]] = {}
    try:
        with open(locks, encoding="ascii", errors="replace") as fh:
            for line in fh:
                fields = line.split()
                # "1: FLOCK  ADVISORY  WRITE 1234 fd:01:5678 0 EOF"; waiters have "->".
                if len(fields) < 6 or fields[1] == "->":
                    continue
                if is_digits(fields[4]) and int(fields[4]) > 0:
                    table.setdefault(fields[5], []).append(int(fields[4]))
    except OSError:
        return None
    return table


def file_key(dev: int, ino: int) -> str:
    """How /proc/locks names a file: hex major and minor device numbers, decimal inode."""
    return f"{os.major(dev):02x}:{os.minor(dev):02x}:{ino}"


def lock_pids(
    dev: int, ino: int, table: Optional[dict[str, list[int]]] = None
) -> Optional[list[int]]:
    """Pids holding a lock on the file (dev, ino); None when /proc/locks cannot be read."""
    table = lock_table() if table is None else table
    return None if table is None else table.get(file_key(dev, ino), [])


def state(pid: int) -> Optional[str]:
    """The one-letter state of process `pid` (R, S, T, ...); None when it does not exist."""
    try:
        with open(f"{PROC}/{pid}/stat", "rb") as fh:
            raw = fh.read(4096)
    except OSError:
        return None
    # The command name in parentheses may itself contain ") ": the state follows the last.
    _, _, rest = raw.rpartition(b")")
    fields = rest.split()
    return fields[0].decode("ascii", "replace") if fields else None


def is_stopped(pid: int) -> bool:
    return state(pid) in STOPPED


def is_gone(pid: int) -> bool:
    s = state(pid)
    return s is None or s in GONE


def real_uid(pid: int) -> Optional[int]:
    """The real uid process `pid` runs as (what `kill(2)` compares); None if unknown."""
    try:
        with open(f"{PROC}/{pid}/status", encoding="ascii", errors="replace") as fh:
            for line in fh:
                if line.startswith("Uid:"):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return None


def command_name(pid: int) -> str:
    try:
        with open(f"{PROC}/{pid}/comm", "rb") as fh:
            return fh.read(64).decode("utf-8", "replace").strip()
    except OSError:
        return "?"


def holds_file(pid: int, dev: int, ino: int) -> bool:
    """True when process `pid` has the file (dev, ino) open: the kernel's word that it is
    the holder of a lease whose lock lives in that file. False when it does not, or when
    we may not look (another user's process, unless we are root)."""
    folder = f"{PROC}/{pid}/fd"
    try:
        names = os.listdir(folder)
    except OSError:
        return False
    for name in names:
        try:
            st = os.stat(os.path.join(folder, name))
        except OSError:
            continue
        if st.st_ino == ino and st.st_dev == dev:
            return True
    return False


def describe(pid: int) -> str:
    """`user pid N (comm)` for messages, from /proc."""
    from gpuwarden.files.safefiles import owner_name

    uid = real_uid(pid)
    who = owner_name(uid) if uid is not None else "?"
    return f"{who} pid {pid} ({command_name(pid)})"


class Target:
    """A process proven to hold a file, ready to be signalled. It is pinned by a pidfd
    where the system has them, so a pid reused after the check is never signalled."""

    def __init__(self, pid: int, pidfd: Optional[int]) -> None:
        self.pid = pid
        self._pidfd = pidfd

    def send(self, signum: int = signal.SIGTERM) -> None:
        try:
            if self._pidfd is not None:
                signal.pidfd_send_signal(self._pidfd, signum)
            else:
                os.kill(self.pid, signum)
        except ProcessLookupError:
            pass

    def close(self) -> None:
        if self._pidfd is not None:
            os.close(self._pidfd)
            self._pidfd = None


def prove(pid: int, st: os.stat_result) -> tuple[Optional[Target], str]:
    """(a Target, "") when process `pid` holds the file `st` open and the caller may
    signal it, else (None, why not). May signal: the process runs as the caller, or the
    caller is root and the process runs as the file's owner (root ends a user's
    reservation, never an unrelated process that a forged file names)."""
    if pid <= 0:
        return None, f"pid {pid} is not a process"
    pidfd = None
    if hasattr(os, "pidfd_open"):
        try:
            pidfd = os.pidfd_open(pid)
        except ProcessLookupError:
            return None, f"pid {pid} is not running"
        except OSError:
            pidfd = None  # kernel before 5.3: the checks below still hold
    try:
        if is_gone(pid):
            return None, f"pid {pid} is not running"
        uid = real_uid(pid)
        me = os.geteuid()
        if uid is None:
            return None, f"cannot tell whom pid {pid} runs as"
        if not (uid == me or (me == 0 and uid == st.st_uid)):
            return None, (
                f"pid {pid} runs as {describe(pid).split()[0]}, not as the owner of the lease"
            )
        if not holds_file(pid, st.st_dev, st.st_ino):
            return None, f"pid {pid} does not hold the lease (it is not the holder)"
    except BaseException:
        if pidfd is not None:
            os.close(pidfd)
        raise
    target = Target(pid, pidfd)
    if pidfd is not None and is_gone(pid):  # ended (and maybe reused) during the checks
        target.close()
        return None, f"pid {pid} is not running"
    return target, ""


def prove_holder(lease_dir: str, info: Any, what: str) -> Target:
    """The holder of lease `info` (a `leases.LeaseInfo` in `lease_dir`), proven by the
    kernel (`prove`): the pid in the record is only a claim, since anyone can write that
    file. Raises UserError, naming `what` ("reservation r-1", "Slurm job 42"), when the
    record cannot be opened or its pid may not be signalled."""
    from gpuwarden.base.errors import UserError
    from gpuwarden.files.safefiles import open_regular
    from gpuwarden.leases.record import HOLDER_SUFFIX

    path = os.path.join(lease_dir, f"{info.uuid}.{info.job}{HOLDER_SUFFIX}")
    try:
        fd, st = open_regular(path, what="lease record")
    except (OSError, UserError) as err:
        raise UserError(f"{what}: cannot open its lease record: {err}") from None
    os.close(fd)
    target, why = prove(info.pid, st)
    if target is None:
        raise UserError(f"{what}: not signalling pid {info.pid}: {why}; nothing was done")
    return target
