"""A process's ancestry, from the kernel: how a GPU process is tied to the lease whose
job started it (a lease names its job's first process; the job's children carry
that pid among their ancestors). Kept apart from the watcher so that `gpuwarden
status` can mark unleased processes without loading it."""

from __future__ import annotations


def lineage(pid: int, proc: str = "/proc") -> tuple[int, ...]:
    """`pid` and its ancestors, from the kernel's /proc/<pid>/stat; just (pid,) when it is
    not a process here (another PID namespace, or a simulated one)."""
    chain = [pid]
    seen = {pid}
    current = pid
    while current > 1:
        try:
            with open(f"{proc}/{current}/stat", "rb") as f:
                stat = f.read(4096)
            parent = int(stat.rsplit(b")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            break
        if parent in seen or parent <= 0:
            break
        chain.append(parent)
        seen.add(parent)
        current = parent
    return tuple(chain)
