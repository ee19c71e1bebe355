"""A running job's process, known by a pidfd taken while it is certainly the job's.

The service runs as root, so a signal sent to a stored pid number after the job
ended would reach whatever process took that number since. The service never does
that: it opens a pidfd of the job's first process (`claim`) and checks, while the
pidfd is open, that the process is the child of the job's supervisor (which waits
for it, so until the supervisor has reaped it the number cannot be reused). Signals
then go through the pidfd, and to the job's process group only while that pidfd
says its leader has not exited: a live leader keeps its number, and so the group's,
to itself. Where the job has a cgroup, its members are signalled too
(`JobLife.signal`): that is how processes that left the group are reached.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
from typing import Optional


def parent_of(pid: int) -> int:
    """The parent pid of `pid` (/proc/PID/stat field 4), -1 when it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            text = fh.read().decode("ascii", "replace")
        return int(text.rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return -1


def exited(pidfd: int, within: float = 0) -> bool:
    """Whether the process of `pidfd` has exited (the pidfd polls readable then), waiting
    up to `within` seconds for it: how a process not our child is waited for."""
    poller = select.poll()
    poller.register(pidfd, select.POLLIN)
    return bool(poller.poll(int(within * 1000)))


def claim(pid: int, parent: int) -> Optional[int]:
    """A pidfd of `pid` if it is, now, the child of `parent` (the job's supervisor);
    None when it has exited or is not (its number was taken by another process)."""
    if pid <= 0 or parent <= 0:
        return None
    try:
        fd = os.pidfd_open(pid)
    except OSError:
        return None
    # Read after the pidfd was opened and checked alive after: the process read in
    # /proc is then the pidfd's, not a later holder of the number.
    if parent_of(pid) != parent or exited(fd):
        os.close(fd)
        return None
    return fd


def signal_group(pidfd: int, pgid: int, sig: int) -> bool:
    """`sig` once to each process of the job's process group while its first process
    has not exited (its number is the group's then); to that process alone, through its
    pidfd, when the group is gone (it left it). Both would give the first process two:
    a job that takes a second SIGINT or SIGTERM for "abort now" would lose its
    checkpoint. False when it has exited (nothing was sent)."""
    if exited(pidfd):
        return False
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)  # the leader is alive: the group with its number is the job's
        return True
    try:
        signal.pidfd_send_signal(pidfd, sig)
    except ProcessLookupError:
        return False
    return True
