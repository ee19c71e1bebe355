"""What a job's own process does between the supervisor's fork and `exec`: become its
owner for good, in its cgroup, with its umask, directory, output and environment.

Each step is done in the order that leaves the owner no way to steer one done as
root (service.spawn's steps 0-4): the cgroup is joined as root, before anything of
the owner's runs; privileges are dropped before the working directory is entered
and the output opened, so both are judged as the owner; no descriptor but the
standard three and the two pipes to the supervisor survives (none of the leases').
A failure raises UserError, which the supervisor reports as the job's error.

The supervisor's own first steps, which need nothing of its job, are here too
(`become_supervisor`), so that a spare supervisor takes them before its launch.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Mapping
from typing import Optional, Protocol

from gpuwarden.base.errors import UserError
from gpuwarden.service import jobterminal, tree
from gpuwarden.service.identity import Person

TYPE_CHECKING = False
if TYPE_CHECKING:
    import signal
else:
    # The C module the standard `signal` wraps: the same calls and numbers, without its
    # conversions to and from enum members on each call, which in a freshly forked
    # supervisor or job touched (and so copied) ~60 pages of the forker's memory for
    # four dispositions: ~0.35 ms a process.
    import _signal as signal


class Launch(Protocol):
    """What the job's process reads of its start (service.spawn.JobStart has it)."""

    @property
    def argv(self) -> tuple[str, ...]: ...
    @property
    def owner(self) -> Person: ...
    @property
    def cwd(self) -> str: ...
    @property
    def env(self) -> Mapping[str, str]: ...
    @property
    def umask(self) -> int: ...
    @property
    def output(self) -> Optional[str]: ...
    @property
    def stdio(self) -> Optional[tuple[int, int, int]]: ...
    @property
    def extra_env(self) -> Mapping[str, str]: ...


#: Variables a job never takes from its submitter: the service sets the GPU ones.
CONTROLLED = ("CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER", "NVIDIA_VISIBLE_DEVICES")
CONTROLLED_PREFIXES = ("GPUWARDEN_",)


def job_environment(submitted: Mapping[str, str], extra: Mapping[str, str]) -> dict[str, str]:
    """The submitter's environment less what the service controls, plus what it sets."""
    env = {
        k: v
        for k, v in submitted.items()
        if k not in CONTROLLED and not k.startswith(CONTROLLED_PREFIXES)
    }
    env.update(extra)
    return env


def drop_privileges(owner: Person) -> None:
    """Become `owner` for good: groups, then gid, then uid (the only order that works:
    after setuid a non-root process may no longer change its groups)."""
    os.setgroups(list(owner.groups))
    os.setresgid(owner.gid, owner.gid, owner.gid)
    os.setresuid(owner.uid, owner.uid, owner.uid)
    if owner.uid != 0:
        try:
            os.setuid(0)
        except PermissionError:
            return
        raise UserError("could still become root after dropping privileges; refusing to run")


def become_job(
    launch: Launch, error_w: int, cgroup: Optional[dict[str, str]] = None, ready: int = -1
) -> None:
    if cgroup:
        # As root, before anything of the owner's runs: the job and all it starts are in
        # the cgroup (only its GPUs open; cancel reaches every process, however detached).
        from gpuwarden.service.jobcgroup import join

        join(cgroup)
    os.setpgid(0, 0)  # its own process group, for a machine without cgroups
    if launch.stdio is not None:
        jobterminal.foreground(launch.stdio[0])
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGPIPE):
        signal.signal(sig, signal.SIG_DFL)
    drop_privileges(launch.owner)
    os.umask(launch.umask)
    try:
        os.chdir(launch.cwd)
    except OSError as err:
        raise UserError(f"cannot enter {launch.cwd}: {err.strerror}") from None
    if launch.stdio is not None:
        stdin, stdout, stderr = launch.stdio
    else:
        stdin = os.open(os.devnull, os.O_RDONLY)
        stdout = stderr = _open_output(launch.output)
    for target, fd in ((0, stdin), (1, stdout), (2, stderr)):
        if fd != target:
            os.dup2(fd, target)
    close_all_but({0, 1, 2, error_w, ready})  # both close-on-exec; no lease descriptor
    env = job_environment(launch.env, launch.extra_env)
    if ready >= 0 and os.read(ready, 1) != b"x":  # the supervisor's go: its marker is named
        raise UserError("its start could not be written to disk; not run")
    try:
        os.execvpe(launch.argv[0], list(launch.argv), env)
    except OSError as err:
        raise UserError(f"cannot run {launch.argv[0]!r}: {err.strerror}") from None


def _open_output(path: Optional[str]) -> int:
    if path is None:
        return os.open(os.devnull, os.O_WRONLY)
    try:
        return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o666)
    except OSError as err:
        raise UserError(f"cannot open output {path}: {err.strerror}") from None


def become_supervisor(keep: set[int]) -> None:
    """A job's supervisor's first steps, which need nothing of its job (a spare takes
    them while it waits for its launch, service.forker): a session of its own, so it
    and the job outlive the service; no descriptor but the standard three and `keep`
    (a copy of the allocation lock or of a client's socket would outlive the
    service's); SIGINT, SIGTERM, SIGHUP and SIGPIPE ignored (SIGPIPE too: a service
    killed before reading its report must not kill it, or the job runs on with nobody
    to record its exit; the job gets SIG_DFL back); the subreaper of what the job
    detaches (service.tree)."""
    os.setsid()
    close_all_but({0, 1, 2, *keep})
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGPIPE):
        signal.signal(sig, signal.SIG_IGN)
    tree.become_subreaper()


def close_all_but(keep: set[int]) -> None:
    """Close every descriptor but `keep`: by close_range(2) over the gaps between the
    kept ones, without reading /proc/self/fd (its listing, and the objects it makes,
    cost a freshly forked supervisor ~0.4 ms, mostly pages copied); each one the
    listing names where the kernel has no close_range (before Linux 5.9) or a filter
    denies it."""
    if tree.close_ranges(sorted(keep)):
        return
    try:
        fds = [int(n) for n in os.listdir("/proc/self/fd")]
    except OSError:
        fds = list(range(3, 1024))
    for fd in fds:
        if fd not in keep:
            try:
                os.close(fd)
            except OSError as err:
                if err.errno != errno.EBADF:
                    raise
