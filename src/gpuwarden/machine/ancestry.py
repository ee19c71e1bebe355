"""A process's ancestry, from the kernel: how a GPU process is tied to the lease whose
job started it (a lease names its job's first process; the job's children carry
that pid among their ancestors). Kept apart from the watcher so that `gpuwarden
status` can mark unleased processes without loading it."""

from __future__ import annotations

from functools import lru_cache

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Optional


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


# --- containers ---------------------------------------------------------------------------------

# How a container runtime names a container's cgroup: Podman `libpod-ID[.scope]`, Docker
# `docker-ID.scope` (systemd) or `/docker/ID` (cgroupfs); ID is 64 hex digits.
_ENGINES = (("libpod-", "podman"), ("docker-", "docker"), ("docker/", "docker"))


def container_of(pid: int, proc: str = "/proc") -> Optional[tuple[str, str]]:
    """(runtime, container id) of the container process `pid` runs in, from the kernel's
    /proc/PID/cgroup; None for a process in no container (or not a process here)."""
    try:
        with open(f"{proc}/{pid}/cgroup", encoding="ascii", errors="replace") as fh:
            text = fh.read(65536)
    except OSError:
        return None
    for line in text.splitlines():
        path = line.split(":", 2)[-1]
        for marker, engine in _ENGINES:
            at = path.rfind(marker)
            if at < 0:
                continue
            cid = path[at + len(marker) :].split("/")[0].split(".")[0]
            if len(cid) == 64 and all(c in "0123456789abcdef" for c in cid):
                return engine, cid
    return None


@lru_cache(maxsize=256)  # a container's labels never change, and its id is never reused
def container_labels(engine: str, cid: str) -> dict[str, str]:
    """The labels of container `cid`, as its runtime reports them ({} when it cannot)."""
    import json
    import subprocess

    try:
        out = subprocess.run(
            [engine, "inspect", "--format", "{{json .Config.Labels}}", cid],
            capture_output=True,
            text=True,
            timeout=10,
        )
        labels = json.loads(out.stdout) if out.returncode == 0 else {}
    except (OSError, ValueError, subprocess.TimeoutExpired):
        return {}
    if not isinstance(labels, dict):
        return {}
    return {str(k): str(v) for k, v in labels.items()}


def container_job(pid: int, proc: str = "/proc") -> Optional[str]:
    """The gpuwarden job whose lease the container of process `pid` runs under (its
    `gpuwarden.lease` label, which `gpuwarden run` sets): "" for a process in a container
    gpuwarden did not start, None for one in no container. The label is only a claim:
    `enforcement.lease_of` accepts it for a lease of the process's own user, or of
    anyone for a process run as root (a rootful runtime, which only root can drive)."""
    found = container_of(pid, proc)
    if found is None:
        return None
    return container_labels(*found).get("gpuwarden.lease", "")
