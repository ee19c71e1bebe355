"""A job's process tree where no cgroup holds it: found from its supervisor, ended with it.

A job's supervisor is a child subreaper (`prctl(PR_SET_CHILD_SUBREAPER)`): a process
of the job that detaches (`setsid`, a double fork) is re-parented to the supervisor,
not to init, so every process the job ever started stays below the supervisor in
/proc's parent links until it exits. The service signals that whole tree on cancel
and time limit, and the supervisor kills what is left of it when the job's own
process ends, before it lets go of the job's leases (it, not the job, holds them).
With a cgroup (`enforce.devices`) the cgroup does the same more strongly; this is
what holds without one. What escapes a tree is said in docs/service.md.
"""

from __future__ import annotations

import contextlib
import functools
import os
import signal
import time
from typing import Any, Optional

PR_SET_CHILD_SUBREAPER = 36


@functools.cache
def _libc() -> Any:
    import ctypes

    return ctypes.CDLL(None, use_errno=True)


#: close_range(2)'s number, the same on every architecture but alpha (new calls since 5.1).
_CLOSE_RANGE = 436


def ready() -> None:
    """Load what `become_subreaper` and `close_ranges` call, in the service (or the
    forker) before it forks a supervisor: the C library's handle and its two functions
    are looked up once, not once per job in each supervisor."""
    with contextlib.suppress(OSError, AttributeError):
        getattr(_libc(), "prctl")  # noqa: B009 - a CDLL keeps each function looked up
        getattr(_libc(), "syscall")  # noqa: B009


def close_ranges(keep: list[int]) -> bool:
    """Close every descriptor but those in `keep` (sorted), one close_range(2) per gap;
    False where the kernel has none or refuses it (the caller closes them otherwise)."""
    import ctypes

    first = 0
    try:
        call = _libc().syscall
        for fd in (*keep, 0x100000000):
            if fd > first and call(_CLOSE_RANGE, first, ctypes.c_uint(fd - 1), 0) != 0:
                return False
            first = max(first, fd + 1)
    except (OSError, AttributeError):
        return False
    return True


def become_subreaper() -> bool:
    """Make this process the subreaper of all it starts (False where the kernel says no)."""
    try:
        return int(_libc().prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)) == 0
    except (OSError, AttributeError):
        return False


def _parent_and_state(pid: int) -> Optional[tuple[int, str]]:
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            text = fh.read().decode("ascii", "replace")
        fields = text.rsplit(")", 1)[1].split()
        return int(fields[1]), fields[0]
    except (OSError, ValueError, IndexError):
        return None


def descendants(root: int) -> list[int]:
    """The live (not zombie) processes below `root`, from one reading of /proc."""
    children: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        found = _parent_and_state(int(name))
        if found is not None and found[1] != "Z":
            children.setdefault(found[0], []).append(int(name))
    out: list[int] = []
    todo = [root]
    while todo:
        for child in children.get(todo.pop(), ()):
            out.append(child)
            todo.append(child)
    return out


def signal_tree(root: int, sig: int) -> int:
    """`sig` to every process below `root`; each is named by a pidfd and checked to be
    still below `root` once named, so a pid reused meanwhile is never signalled."""
    below = descendants(root)
    tree = {root, *below}
    sent = 0
    for pid in below:
        try:
            fd = os.pidfd_open(pid)
        except OSError:
            continue  # gone already
        try:
            found = _parent_and_state(pid)
            if found is None or found[0] not in tree:
                continue
            with contextlib.suppress(ProcessLookupError):
                signal.pidfd_send_signal(fd, sig)
                sent += 1
        finally:
            os.close(fd)
    return sent


def end_tree(within: float = 10.0) -> None:
    """In the supervisor once the job's own process has ended: SIGKILL everything still
    below it and reap it all (bounded: a process stuck in the kernel is left to the
    service's own sweep)."""
    deadline = time.monotonic() + within
    me = os.getpid()
    if not _reap_all():
        # No child left: nothing lives below a subreaper that has no children (what a
        # process of the job left would have been re-parented here), so no reading of
        # every process on the machine on the way from a job's end to the next start.
        return
    while True:
        left = signal_tree(me, signal.SIGKILL)
        _reap_all()
        if not left or time.monotonic() > deadline:
            return
        time.sleep(0.005)


def _reap_all() -> bool:
    """Reap every child that has ended; whether any child is still there."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return False
        if pid == 0:
            return True
