"""Containers under a lease, the runtime part: starting the runtime's client with the
lease descriptors (numbered from 3 for Podman's --preserve-fds), stopping the container
on Ctrl-C and SIGTERM, Docker's keeper, and the job the queue service runs for a
container command (`python -m gpuwarden.containers.runtime`). The command line itself is
gpuwarden.containers.command's; docs/containers.md says why each piece is there.
"""

from __future__ import annotations

import os

from gpuwarden.base.errors import UserError
from gpuwarden.containers import command

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence
    from typing import Optional

    from gpuwarden.containers.command import Plan
    from gpuwarden.jobs.launch import StartedJob


# --- the client ---------------------------------------------------------------------------


class Stopper:
    """On Ctrl-C, SIGTERM or SIGHUP to `gpuwarden run`: `RUNTIME stop NAME`, once. The
    runtime sends the container's stop signal and kills it after its grace
    (`--stop-timeout`, 10 s by default); the client then exits with the container's
    status. The signal still reaches the client too (its sig-proxy passes it on), which
    covers a container not created yet."""

    STOPPING = frozenset((2, 15, 1))  # SIGINT, SIGTERM, SIGHUP

    def __init__(self, runtime: str, name: str, env: Mapping[str, str]) -> None:
        self.argv = [runtime, "stop", name]
        self.env = dict(env)
        self.pid: Optional[int] = None

    def __call__(self, signum: int) -> None:
        if signum not in self.STOPPING or self.pid is not None:
            return
        import signal

        null = os.open(os.devnull, os.O_RDWR)
        # Started with the stopping signals ignored (an ignored signal stays ignored across
        # exec): a queue service's cancel signals every process of the job, again while new
        # ones appear, and a `stop` killed half-way leaves the container running.
        saved = {s: signal.signal(s, signal.SIG_IGN) for s in self.STOPPING}
        try:
            moves = [(os.POSIX_SPAWN_DUP2, null, fd) for fd in (0, 1, 2)]
            self.pid = os.posix_spawnp(self.argv[0], self.argv, self.env, file_actions=moves)
        except OSError:
            self.pid = 0
        finally:
            for signum, handler in saved.items():
                signal.signal(signum, handler)
            os.close(null)


def start(plan: Plan, env: Mapping[str, str], fds: Sequence[int]) -> StartedJob:
    """Start the runtime's client as the job: the lease descriptors inherited, and with
    Podman also numbered from 3 for --preserve-fds; signals also stop the container."""
    from gpuwarden.jobs import launch

    full = {**env, **plan.env}
    job = launch.start(plan.argv, full, fds, numbered=fds if plan.preserve else ())
    if plan.name is not None:
        job.on_signal = Stopper(plan.runtime, plan.name, full)
    if plan.keeper and plan.name is not None:
        keep(plan.runtime, plan.name, job.pid, fds, full)
    return job


def keep(runtime: str, name: str, client: int, fds: Sequence[int], env: Mapping[str, str]) -> int:
    """Fork a keeper that holds the lease descriptors `fds` until the container `name`
    has ended: first the client (pid `client`) must end, then `RUNTIME wait NAME` returns
    (at once when the container is gone). It runs in its own session with no terminal and
    keeps no other descriptor (not the allocation lock), so it outlives `gpuwarden run`
    and the client and holds nothing else. Its pid."""
    import contextlib

    pid = os.fork()
    if pid:
        return pid
    code = 0
    try:
        os.setsid()
        null = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(null, fd)
        keep_fds = {0, 1, 2, *fds}
        for entry in os.listdir("/proc/self/fd"):
            if int(entry) not in keep_fds:
                with contextlib.suppress(OSError):  # the listing's own descriptor
                    os.close(int(entry))
        _wait_for(client)
        waiter = os.posix_spawnp(runtime, [runtime, "wait", name], dict(env))
        os.waitpid(waiter, 0)
    except BaseException:
        code = 1
    finally:
        os._exit(code)


def _wait_for(pid: int) -> None:
    """Return when process `pid` (not our child) has ended: its pidfd becomes readable;
    without pidfds (Linux before 5.3), its /proc entry is looked at twice a second."""
    import select
    import time

    try:
        pidfd = os.pidfd_open(pid)
    except ProcessLookupError:
        return
    except (AttributeError, OSError):
        from gpuwarden.leases.holders import is_gone

        while not is_gone(pid):
            time.sleep(0.5)
        return
    select.select([pidfd], [], [])
    os.close(pidfd)


def _wait_container(runtime: str, name: str, env: Mapping[str, str], remove: bool) -> None:
    """Return when the container `name` has ended (at once when it is gone already); then
    remove it when its command asked for --rm, which its client, gone before it ended,
    could not do."""
    null = os.open(os.devnull, os.O_RDWR)
    try:
        moves = [(os.POSIX_SPAWN_DUP2, null, fd) for fd in (0, 1, 2)]
        for verb in ("wait", "rm") if remove else ("wait",):
            pid = os.posix_spawnp(runtime, [runtime, verb, name], dict(env), file_actions=moves)
            os.waitpid(pid, 0)
    except OSError:
        pass
    finally:
        os.close(null)


# --- inside a queue service's job ------------------------------------------------------------


def driver_minors(root: str = "/proc/driver/nvidia/gpus") -> dict[str, int]:
    """GPU UUID -> device minor, from the NVIDIA driver's /proc files (no NVML)."""
    found: dict[str, int] = {}
    try:
        names = os.listdir(root)
    except OSError:
        return found
    for name in names:
        fields: dict[str, str] = {}
        try:
            with open(os.path.join(root, name, "information"), encoding="ascii") as fh:
                for line in fh:
                    key, _, value = line.partition(":")
                    fields[key.strip()] = value.strip()
            found[fields["GPU UUID"]] = int(fields["Device Minor"])
        except (OSError, KeyError, ValueError, UnicodeDecodeError):
            continue
    return found


def lease_fds(uuids: Sequence[str], job: str, fd_dir: str = "/proc/self/fd") -> list[int]:
    """The descriptors this process inherited for the lease of `job` on `uuids`: its
    `<uuid>.lock` and `<uuid>.<job>.lease` files, in descriptor order."""
    wanted = {f"{u}.lock" for u in uuids} | {f"{u}.{job}.lease" for u in uuids}
    found = []
    for entry in os.listdir(fd_dir):
        try:
            target = os.readlink(os.path.join(fd_dir, entry))
        except OSError:
            continue
        if os.path.basename(target) in wanted:
            found.append(int(entry))
    return sorted(found)


def main(args: Sequence[str]) -> int:
    """`python -m gpuwarden.containers.runtime [--dev DIR] -- CMD...`, run by the queue service as
    the job: the GPUs, job id and lease descriptors are the service's (GPUWARDEN_GPUS,
    GPUWARDEN_GPU_INDICES, GPUWARDEN_JOB, inherited), the rest as `gpuwarden run` does."""
    import sys
    from types import SimpleNamespace

    args = list(args)
    dev = "/dev"
    if args[:1] == ["--dev"] and len(args) > 1:
        dev, args = args[1], args[2:]
    if args[:1] == ["--"]:
        args = args[1:]
    env = dict(os.environ)
    uuids = [u for u in env.get("GPUWARDEN_GPUS", "").split(",") if u]
    indices = [i for i in env.get("GPUWARDEN_GPU_INDICES", "").split(",") if i]
    job = env.get("GPUWARDEN_JOB", "")
    try:
        if not uuids or len(indices) != len(uuids) or not job:
            raise UserError("not started by the queue service: no GPUWARDEN_GPUS/GPUWARDEN_JOB")
        minors = driver_minors()
        gpus = [
            SimpleNamespace(uuid=u, index=int(i), minor=minors.get(u, int(i)))
            for u, i in zip(uuids, indices)
        ]
        fds = lease_fds(uuids, job)
        # A service's job ids start at 1 again: the pid keeps the container's name new.
        name = f"gpuwarden-{job}-{os.getpid()}"
        found = command.plan_here(args, gpus, job, len(fds), env, dev, name)
        if found is None:
            raise UserError(f"not a container command: {' '.join(args[:2])}")
        started = start(found, env, fds)
        code = int(started.wait())
        stopper = started.on_signal
        if isinstance(stopper, Stopper) and stopper.pid:
            # Cancelled: the client may end first (the service signals all of the job, and
            # its signal proxy with it), and the job's end is when the service kills what is
            # left of it, a `stop` half-way included; the job ends when the stop has.
            os.waitpid(stopper.pid, 0)
        if found.name is not None:
            # The client can end before its container (killed on its own; the container
            # runs on under the runtime's monitor). The service holds the GPUs until this
            # job ends, so the job ends when the container has.
            _wait_container(found.runtime, found.name, env, "--rm" in found.argv)
        return code
    except UserError as err:
        print(f"gpuwarden: {err}", file=sys.stderr)
        return err.exit_code


if __name__ == "__main__":
    import sys

    sys.exit(main(sys.argv[1:]))
