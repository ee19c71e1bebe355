"""Where this process's cgroups are, and which device isolation it can get there.

Everything here reads the kernel's own files (/proc/self/mounts, /proc/self/cgroup)
and decides from their text alone (`judge`, pure), so `gpuwarden doctor`, `run` and
the service all say the same about a machine, and the judgement is tested on the
mount tables of machines this one is not: cgroup v1 with a `devices` controller,
cgroup v2 (a BPF device program per job), read-only mounts inside a container.
"""

from __future__ import annotations

import os

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Optional

MODES = ("none", "cgroup-v1", "cgroup-v2-bpf", "systemd")


def own_paths(proc_cgroup: str) -> dict[str, str]:
    """Controller -> path from the text of /proc/<pid>/cgroup ("" names the v2 hierarchy)."""
    paths: dict[str, str] = {}
    for line in proc_cgroup.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        for controller in parts[1].split(",") if parts[1] else ("",):
            paths[controller] = parts[2]
    return paths


def v1_mounts(mounts: str) -> dict[str, str]:
    """Controller -> mount point of each cgroup v1 hierarchy in /proc/self/mounts text."""
    found: dict[str, str] = {}
    for line in mounts.splitlines():
        fields = line.split()
        if len(fields) < 4 or fields[2] != "cgroup":
            continue
        for option in fields[3].split(","):
            found.setdefault(option, fields[1])
    return found


def v2_mount(mounts: str) -> Optional[str]:
    for line in mounts.splitlines():
        fields = line.split()
        if len(fields) >= 3 and fields[2] == "cgroup2":
            return fields[1]
    return None


def read_only(mounts: str, mountpoint: str) -> bool:
    """Whether /proc/self/mounts text has `mountpoint` mounted read-only (as containers
    usually mount the cgroup filesystems)."""
    for line in mounts.splitlines():
        fields = line.split()
        if len(fields) >= 4 and fields[1] == mountpoint:
            return "ro" in fields[3].split(",")
    return False


def judge(euid: int, mounts: str, proc_cgroup: str, pid1: str) -> tuple[str, str]:
    """(mode, why): which device isolation `gpuwarden run` gets here, from the facts.

    `mode` is one of MODES ("systemd" is not chosen: see docs/enforcement.md); with "none",
    `why` says what is missing, so that `gpuwarden doctor` can tell the admin."""
    v1 = v1_mounts(mounts)
    if "devices" in v1:
        if euid != 0:
            return (
                "none",
                "not root: only root can create device cgroups (run as root, or the service)",
            )
        if "devices" not in own_paths(proc_cgroup):
            return "none", "this process is in no cgroup v1 `devices` hierarchy"
        if read_only(mounts, v1["devices"]):
            return "none", f"{v1['devices']} is mounted read-only (in a container?)"
        return "cgroup-v1", f"cgroup v1 devices controller at {v1['devices']}"
    v2 = v2_mount(mounts)
    if v2 is not None:
        if euid != 0:
            return (
                "none",
                "not root: only root can attach device programs (run as root, or the service)",
            )
        if "" not in own_paths(proc_cgroup):
            return "none", "this process is in no cgroup v2 hierarchy"
        if read_only(mounts, v2):
            return "none", f"{v2} is mounted read-only (in a container?)"
        where = f"cgroup v2 at {v2}: a BPF device program per job"
        if pid1 == "systemd":
            where += " (systemd is PID 1: a service should use a delegated unit)"
        return "cgroup-v2-bpf", where
    return "none", "no cgroup filesystem mounted"


def read_text(path: str, limit: int = 65536) -> str:
    """A kernel file's text (/proc, a cgroup's), at most `limit` bytes, no link followed."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    try:
        return os.read(fd, limit).decode(errors="replace")
    finally:
        os.close(fd)


def detect() -> tuple[str, str]:
    """`judge` over this machine and process."""
    try:
        mounts = read_text("/proc/self/mounts", 1 << 20)
        own = read_text("/proc/self/cgroup")
    except OSError as err:
        return "none", f"cannot read /proc: {err.strerror}"
    try:
        pid1 = read_text("/proc/1/comm").strip()
    except OSError:
        pid1 = ""
    return judge(os.geteuid(), mounts, own, pid1)
