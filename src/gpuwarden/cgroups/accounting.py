"""A job's processes, CPU and memory, and signals to all of it, from its cgroups.

The cgroups `gpuwarden.cgroups.devices` makes for a job hold every process the job
started, however it forked, daemonised or left its process group, so they are
where the job's usage is read and where a cancel or a kill reaches all of it.
A job is found from any of its processes through the kernel's
/proc/<pid>/cgroup, not from a file anyone could write.
"""

from __future__ import annotations

import errno
import os
import signal

from gpuwarden.base.units import is_digits
from gpuwarden.cgroups.devices import GROUP
from gpuwarden.cgroups.hierarchy import own_paths, read_text, v1_mounts, v2_mount

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Optional


#: The most of a cgroup.procs read (pids of a few hundred thousand processes).
PROCS_MOST = 1 << 22


def pids_in(path: str) -> list[int]:
    """The processes in a cgroup: the job's whole tree, however it forked or daemonised.
    Read 64 KiB at a time up to PROCS_MOST: one read into a buffer of that size cost
    a 4 MiB mapping and its unmapping to find an ended job's cgroup empty."""
    chunks: list[bytes] = []
    try:
        fd = os.open(
            os.path.join(path, "cgroup.procs"), os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK
        )
        try:
            size = 0
            while size < PROCS_MOST:
                chunk = os.read(fd, 1 << 16)
                if not chunk:
                    break
                chunks.append(chunk)
                size += len(chunk)
        finally:
            os.close(fd)
    except OSError:
        return []
    return [int(x) for x in b"".join(chunks).split() if x.isdigit()]  # ASCII digits only


def _number(path: str) -> Optional[int]:
    try:
        text = read_text(path).strip()
    except OSError:
        return None
    return int(text) if is_digits(text) else None


def usage_of(dirs: dict[str, str]) -> dict[str, Optional[int]]:
    """CPU and memory the job used: `cpu_ns` (all its processes, since it started),
    `memory` (now) and `memory_peak` (bytes); None for what this machine does not account."""
    out: dict[str, Optional[int]] = {"cpu_ns": None, "memory": None, "memory_peak": None}
    if "cpuacct" in dirs:
        out["cpu_ns"] = _number(os.path.join(dirs["cpuacct"], "cpuacct.usage"))
    if "memory" in dirs:
        out["memory"] = _number(os.path.join(dirs["memory"], "memory.usage_in_bytes"))
        out["memory_peak"] = _number(os.path.join(dirs["memory"], "memory.max_usage_in_bytes"))
    if "" in dirs:  # cgroup v2
        try:
            stat = dict(
                line.split() for line in read_text(os.path.join(dirs[""], "cpu.stat")).splitlines()
            )
            out["cpu_ns"] = int(stat["usage_usec"]) * 1000
        except (OSError, KeyError, ValueError):
            pass
        out["memory"] = _number(os.path.join(dirs[""], "memory.current"))
        out["memory_peak"] = _number(os.path.join(dirs[""], "memory.peak"))
    return out


def job_cgroups(pid: int) -> dict[str, str]:
    """The gpuwarden job cgroups process `pid` is in (controller -> directory): how a job is
    found from a lease's pid. The kernel's /proc/<pid>/cgroup, not a file anyone wrote."""
    try:
        own = own_paths(read_text(f"/proc/{pid}/cgroup"))
        mounts_text = read_text("/proc/self/mounts", 1 << 20)
    except OSError:
        return {}
    mounts, v2 = v1_mounts(mounts_text), v2_mount(mounts_text)
    found = {}
    for controller, path in own.items():
        if f"/{GROUP}/" not in path + "/":
            continue
        base = v2 if controller == "" else mounts.get(controller)
        if base is not None:
            found[controller] = os.path.join(base, path.lstrip("/"))
    return found


def usage(pid: int) -> dict[str, Optional[int]]:
    """CPU and memory of the job whose process is `pid` (see `usage_of`)."""
    return usage_of(job_cgroups(pid))


def signal_job(pid: int, signum: int) -> int:
    """Send `signum` to every process in `pid`'s job cgroup; how many were signalled."""
    dirs = job_cgroups(pid)
    where = dirs.get("devices", dirs.get(""))
    if where is None:
        return 0
    sent = 0
    for target in pids_in(where):
        try:
            os.kill(target, signum)
            sent += 1
        except OSError as err:
            if err.errno != errno.ESRCH:
                raise
    return sent


def signal_dirs(dirs: dict[str, str], signum: int, rounds: int = 8) -> int:
    """Send `signum` to every process in a job's cgroups (`dirs`, controller -> path); how
    many got it. A process that left its process group or session is still in the cgroup:
    none escapes. SIGKILL goes again while new ones appear (a process forking as it is
    killed); any other signal once to each process there when asked, as Slurm's scancel
    does: what a handler starts in answer (a `podman stop`, a checkpoint's upload) is the
    job's answer to the signal, not another target of it."""
    where = dirs.get("devices", dirs.get(""))
    if where is None:
        return 0
    done: set[int] = set()
    for _ in range(rounds if signum == signal.SIGKILL else 1):
        fresh = [p for p in pids_in(where) if p not in done]
        if not fresh:
            break
        for target in fresh:
            done.add(target)
            try:
                os.kill(target, signum)
            except OSError as err:
                if err.errno != errno.ESRCH:
                    raise
    return len(done)
