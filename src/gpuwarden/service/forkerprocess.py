"""The forker process itself (service.forker is the service's handle on it): it forks a
spare supervisor per request of the service, each of which takes its first steps,
waits for a launch on a socket of its own and runs it, and then, while nothing of its
job is left, waits for another (`_recyclable`).

A spare and a recycled supervisor end by `os._exit` after their own cleanup: they are
forks of this interpreter, whose finalisation (its modules, its garbage, the buffers
and atexit hooks it inherited) is not theirs to run, and every page it would touch
would first be copied.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import sys
from typing import Any

from gpuwarden.base.errors import UserError
from gpuwarden.service.forker import MOST_FDS, receive, send

TYPE_CHECKING = False
if TYPE_CHECKING:
    import signal

    from gpuwarden.service.spawn import JobStart
else:
    import _signal as signal  # `signal` without its enum conversions (service.becoming)

#: The jobs one supervisor runs before it exits all the same (whatever an interpreter
#: keeps grows no further).
MOST_JOBS = 256


def serve(sock: socket.socket) -> None:
    """Fork a spare supervisor per request until the service's end of `sock` closes."""
    from gpuwarden.service import spawn

    children: set[int] = set()

    def reap(*_: object) -> None:
        # Only children whose pidfd was taken: none is reaped before the service has one.
        for pid in list(children):
            with contextlib.suppress(ChildProcessError):
                if os.waitpid(pid, os.WNOHANG)[0] == 0:
                    continue
            children.discard(pid)

    signal.signal(signal.SIGCHLD, reap)
    while True:
        try:
            data, fds = receive(sock, MOST_FDS)
        except (EOFError, ConnectionError):  # the service has gone
            return
        except ValueError as err:
            data, fds = {"error": str(err)}, []
        for fd in fds:  # a request for a spare has none
            os.close(fd)
        out: list[int] = []
        try:
            if "error" in data:
                raise UserError(str(data["error"]))
            pid, since, pidfd, theirs = _fork_spare(spawn, data, sock, children)
            answer: dict[str, Any] = {"pid": pid, "since": since}
            out = [pidfd, theirs]
        except Exception as err:  # said to the service, which fails that start
            answer = {"error": spawn._describe(err)}
        try:
            send(sock, json.dumps(answer).encode(), out)
        except OSError:  # the service is gone: so is the spare's socket's other end
            return
        finally:
            for fd in out:
                os.close(fd)
        reap()


def _fork_spare(
    spawn: Any, data: dict[str, Any], sock: socket.socket, children: set[int]
) -> tuple[int, int, int, int]:
    """Fork a supervisor that waits for its launch: its pid, start time, a pidfd of it,
    and the other end of the socket it waits on."""
    status_dir = str(data.get("spare") or "")
    if status_dir:  # where the jobs' cgroups go, worked out here once, not per job
        with contextlib.suppress(Exception):
            from gpuwarden.service import jobcgroup

            jobcgroup.place(status_dir)
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    pid = os.fork()
    if pid == 0:  # the supervisor, once it has its launch
        code = 70
        try:
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            sock.close()
            theirs.close()
            code = _supervise_when_told(spawn, ours, status_dir)
        finally:
            os._exit(code)
    ours.close()
    try:  # before any reaping of it: the pid, and what /proc says of it, are its own
        pidfd = os.pidfd_open(pid)
        return pid, spawn.start_time(pid), pidfd, theirs.detach()
    except BaseException:
        theirs.close()
        raise
    finally:
        children.add(pid)  # reaped from now on, whether the service heard of it or not


def _supervise_when_told(spawn: Any, sock: socket.socket, status_dir: str) -> int:
    """In a spare: take a supervisor's first steps (`becoming.become_supervisor`) and
    make what a job of `status_dir` needs before it runs (service.staging; its cgroups'
    place), then wait for a launch and run it, and again while `_recyclable` allows;
    none (the service or its forker let go of us): exit, having run nothing (more),
    the staged files removed."""
    from gpuwarden.service import becoming, jobcgroup, staging

    becoming.become_supervisor({sock.fileno()})
    since, code, again = spawn.start_time(), 0, False
    for last in range(MOST_JOBS, 0, -1):
        staged, placed = None, None
        if status_dir:
            with contextlib.suppress(UserError):  # else made after the launch, or said why not
                staged = staging.stage(status_dir, os.getpid(), since)
            with contextlib.suppress(Exception):
                placed = (status_dir, jobcgroup.place(status_dir))
        launch = None
        try:
            if again:  # ready for another job, what it needs made
                sock.send(b"r")
            data, fds = receive(sock, MOST_FDS)
            launch = _decode(data, fds)
        except (EOFError, ValueError, OSError):
            return code
        finally:
            if launch is None and staged is not None:  # no job: its files go
                staged.discard()
        if staged is not None and launch.status_dir != status_dir:  # not where it staged
            staged.discard()
            staged = None
        where = spawn._ready(launch, placed)
        code = int(spawn._supervise(launch, fds[0], fds[1], where, become=False, staged=staged))
        again = last > 1 and _recyclable(launch, sock)
        if not again:
            break
    return code


def _recyclable(launch: JobStart, sock: socket.socket) -> bool:
    """Whether this supervisor, its job ended, may take another launch: its job ran and
    its exit record is in place (a restarted service needs nothing more of it for that
    job; a start that failed is answered by the supervisor's exit), it took no client's
    terminal (its session would keep it), and it holds nothing of the job (its tree
    ended; every descriptor but its socket closed here: the job's leases among them)."""
    from gpuwarden.service import becoming, exitrecord

    if launch.stdio is not None:
        return False
    ended = exitrecord.read_exit_record(launch.status_dir, launch.job)
    if ended is None or ended.error is not None:
        return False
    becoming.close_all_but({0, 1, 2, sock.fileno()})
    return True


def load() -> None:
    """What a supervisor and its job call, loaded once in the forker, not after each
    fork; and no more: every page of it is copied into each supervisor's page tables
    at its fork, and into each job's at its own (tests/test_service_forker.py holds
    what it loads)."""
    import fcntl  # noqa: F401
    import pwd  # noqa: F401
    import termios  # noqa: F401

    from gpuwarden.service import becoming, exitrecord, jobcgroup, spawn, staging, tree  # noqa: F401

    with contextlib.suppress(ImportError, OSError):
        from gpuwarden.cgroups import bpf  # noqa: F401
    tree.ready()


def main(argv: list[str]) -> int:
    """The forker: `argv[1]` is its socket's descriptor."""
    load()
    sock = socket.socket(fileno=int(argv[1]))
    serve(sock)
    return 0


def _decode(data: dict[str, Any], fds: list[int]) -> JobStart:
    from gpuwarden.service.identity import Person
    from gpuwarden.service.spawn import JobStart

    uid, gid, name, groups, home, shell = data["owner"]
    stdio = (fds[2], fds[3], fds[4]) if data["stdio"] else None
    first = 5 if data["stdio"] else 2
    keep = tuple(fds[first : first + int(data["keep"])])
    if len(fds) != first + len(keep):
        raise ValueError("descriptors and request disagree")
    minors = data["minors"]
    caps = data["caps"]
    return JobStart(
        job=str(data["job"]),
        argv=tuple(data["argv"]),
        owner=Person(int(uid), int(gid), str(name), tuple(groups), str(home), str(shell)),
        cwd=str(data["cwd"]),
        env=dict(data["env"]),
        status_dir=str(data["status_dir"]),
        umask=int(data["umask"]),
        output=data["output"],
        stdio=stdio,
        keep=keep,
        extra_env=dict(data["extra_env"]),
        minors=None if minors is None else tuple(minors),
        present=tuple(data["present"]),
        devices=str(data["devices"]),
        caps=None if caps is None else (int(caps[0]), tuple(caps[1])),
    )


if __name__ == "__main__":
    sys.exit(main(sys.argv))
