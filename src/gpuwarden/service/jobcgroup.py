"""A queue service job's cgroups: made by its supervisor, joined by the job before exec.

The service (root) does not move itself: its job's supervisor makes `svc-<hash>/job-<id>`
below the service's own cgroups and writes the device rules (`gpuwarden.cgroups.devices`),
and the job's child joins it before it drops to its owner and execs, so the job
and every descendant are confined from their first instruction while the
supervisor stays outside (it must outlive the job to record its status). The
name is the journal's id, so a restarted service finds the cgroups of the jobs it
re-adopts, and removes those of jobs that ended while it was down. The same
cgroups are where a cancel or a time limit reaches every process of the job
(`gpuwarden.cgroups.accounting.signal_dirs`) and where its CPU and memory are read.
"""

from __future__ import annotations

import contextlib
import functools
import os
import re
from dataclasses import dataclass

from gpuwarden.cgroups.devices import (
    DEVICES,
    CgroupError,
    dirs_for,
    fence,
    move_in,
    remove_cgroup,
    remove_dirs,
)
from gpuwarden.cgroups.hierarchy import detect, read_text

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterable, Sequence
    from typing import Optional

_JOB = re.compile(r"job-(\d{1,18})")
_SCOPE = re.compile(r"svc-[0-9a-f]{12}")


@functools.lru_cache(maxsize=64)
def scope_of(state_dir: str) -> str:
    """The directory that holds one service's job cgroups, named after its state
    directory: two services on one machine (a test suite run beside the real one) never
    share job ids, and one never sweeps the other's jobs. The same after a restart."""
    import hashlib

    digest = hashlib.sha256(os.path.realpath(state_dir).encode()).hexdigest()
    return f"svc-{digest[:12]}"


def job_name(scope: str, job: str) -> str:
    name = f"job-{job}"
    if not _JOB.fullmatch(name) or not _SCOPE.fullmatch(scope):
        raise ValueError(f"bad job id {job!r} or scope {scope!r}")
    return f"{scope}/{name}"


def job_dirs(
    scope: str, job: str, mode: Optional[str] = None, existing: bool = True
) -> dict[str, str]:
    """Controller -> directory of the service job `job`'s cgroups (only those that exist
    when `existing`); {} where this machine has no device isolation."""
    if mode is None:
        mode = detect()[0]
    if mode == "none":
        return {}
    try:
        dirs, _ = dirs_for(job_name(scope, job), mode)
    except OSError:
        return {}
    if existing:
        dirs = {c: p for c, p in dirs.items() if os.path.isdir(p)}
    return dirs


def placed_dirs(where: Place, job: str) -> dict[str, str]:
    """Controller -> directory of service job `job`'s cgroups that exist, where
    `make_job` made them (`where`, the service's kept `place`): `job_dirs` without
    reading this process's cgroups and the mount table again for every ended job."""
    name = f"job-{job}"
    if not _JOB.fullmatch(name):
        raise ValueError(f"bad job id {job!r}")
    found = {}
    for controller, scope in where.scopes.items():
        path = os.path.join(scope, name)
        if os.path.isdir(path):
            found[controller] = path
    return found


@dataclass(frozen=True)
class Place:
    """Where one service's job cgroups go, worked out once in the service (`place`), not
    in each job's supervisor: the isolation mode (and why, where it is "none"), per
    controller the directory that holds the jobs' cgroups (`svc-<hash>` below the
    service's own cgroup), and the /proc/self/cgroup text it was worked out from."""

    mode: str
    why: str
    scopes: dict[str, str]
    own: str


_places: dict[str, Place] = {}


def kept_place(status_dir: str) -> Place:
    """The `Place` the last start worked out for `status_dir` (where the jobs running
    now were put), without reading /proc again; `place`'s where none was."""
    known = _places.get(status_dir)
    return known if known is not None else place(status_dir)


def place(status_dir: str) -> Place:
    """The `Place` of the service whose exit records go to `status_dir`. Kept while this
    process's own cgroups (/proc/self/cgroup, one read) stay what they were: a service
    moved to another cgroup puts its next jobs below the new one, as `job_dirs` finds
    them. Called by the service before it forks a supervisor, which inherits it."""
    try:
        own = read_text("/proc/self/cgroup")
    except OSError:
        own = ""  # `detect` says why there is no isolation
    known = _places.get(status_dir)
    if known is not None and known.own == own:
        return known
    mode, why = detect()
    scopes: dict[str, str] = {}
    if mode != "none":
        scope = scope_of(status_dir)
        try:
            dirs, _ = dirs_for(job_name(scope, "0"), mode)
        except OSError:
            dirs = {}
        scopes = {c: os.path.dirname(p) for c, p in dirs.items()}
        if "devices" not in scopes:
            from gpuwarden.cgroups import bpf  # noqa: F401 - loaded here, not per job
    known = _places[status_dir] = Place(mode, why, scopes, own)
    return known


def make_job(
    where: Place,
    job: str,
    minors: Sequence[Optional[int]],
    present: Iterable[int],
    caps: Optional[tuple[int, tuple[int, ...]]] = None,
) -> dict[str, str]:
    """Make service job `job`'s cgroups, allowing only the GPU nodes of `minors` (as root);
    its dirs. `caps`: the nvidia-caps nodes to deny too (other MIG slices',
    `migcaps.denied_for`). Raises CgroupError (and leaves nothing behind) when that is
    impossible. One mkdir per hierarchy: the scope's directory is made only when it is
    missing, and a leftover of a try that never started only when one is there."""
    if where.mode == "none":
        raise CgroupError(f"no device isolation: {where.why}")
    if any(m is None for m in minors):
        raise CgroupError("NVML gives no minor number for a leased GPU: cannot isolate it")
    leased = [m for m in minors if m is not None]
    if not any(c in where.scopes for c in DEVICES):
        raise CgroupError("the service is in no hierarchy that can control devices")
    name = f"job-{job}"
    if not _JOB.fullmatch(name):
        raise ValueError(f"bad job id {job!r}")
    made: dict[str, str] = {}
    try:
        for controller, scope in where.scopes.items():
            path = os.path.join(scope, name)
            try:
                os.mkdir(path, 0o755)
            except FileNotFoundError:
                os.makedirs(scope, 0o755, exist_ok=True)
                os.mkdir(path, 0o755)
            except FileExistsError:  # left by a try that never started: its rules may differ
                remove_cgroup(path)
                os.mkdir(path, 0o755)
            made[controller] = path
        fence(made, leased, present, caps)
    except OSError as err:
        remove_job(made)
        raise CgroupError(f"cannot make the job's device cgroup: {err.strerror}") from None
    return made


def join(dirs: dict[str, str]) -> None:
    """Move this process into `dirs` (the job's child, before exec): its children follow.
    The caller is single-threaded (just forked), so in v1 moving its thread moves it
    whole, without the wait for an RCU grace period a process move has (`move_in`)."""
    for controller, path in dirs.items():
        try:
            move_in(path, controller)
        except OSError as err:
            raise CgroupError(f"cannot join the job's cgroup: {err.strerror}") from None


def remove_job(dirs: dict[str, str]) -> bool:
    """rmdir a service job's cgroups; False when one still holds a process."""
    return remove_dirs(dirs)


def service_jobs(scope: str, mode: Optional[str] = None) -> dict[str, dict[str, str]]:
    """Job id -> dirs of every job cgroup of the service `scope` that exists."""
    if mode is None:
        mode = detect()[0]
    if mode == "none":
        return {}
    try:
        dirs, _ = dirs_for(job_name(scope, "0"), mode)
    except OSError:
        return {}
    found: dict[str, dict[str, str]] = {}
    for controller, path in dirs.items():
        parent = os.path.dirname(path)
        try:
            names = os.listdir(parent)
        except OSError:
            continue
        for name in names:
            match = _JOB.fullmatch(name)
            if match:
                found.setdefault(match.group(1), {})[controller] = os.path.join(parent, name)
    return found


def remove_scope(scope: str) -> None:
    """rmdir the service's own cgroup directories when no job cgroup is left in them (a
    service stopped with jobs running leaves them, and finds them again on restart); a
    machine where services come and go (tests, a moved state directory) keeps no trail."""
    mode = detect()[0]
    if mode == "none":
        return
    try:
        dirs, _ = dirs_for(job_name(scope, "0"), mode)
    except OSError:
        return
    for path in dirs.values():
        with contextlib.suppress(OSError):
            os.rmdir(os.path.dirname(path))
