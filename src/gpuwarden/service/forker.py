"""The small process that forks the jobs' supervisors, so that the service never forks.

A fork of the service (tens of MB of Python objects) marks each of its pages
copy-on-write, and the service's own reference counting then writes to most of them:
the service copied its pages back after every start, a few ms of its CPU per job, and
its loop is what bounds how fast jobs start. The forker is a fresh interpreter
(`python -I`, exec'd, not a fork of the service) that imports
only what a supervisor runs (service.spawn and what it calls), started once by the
service and again if it has died. It forks a supervisor per request and reaps it.

A request comes over a Unix socket pair: the launch as JSON, and its descriptors by
SCM_RIGHTS (the report pipe's write end, the go-ahead pipe's read end, an attached
client's stdio, the lease descriptors); the answer is the supervisor's pid and start
time, and a pidfd of it taken before it could have been reaped, by which the service
watches and kills it. Everything else is as when the service forked: the go-ahead
pipe's write end stays in the service alone (a service that dies before the go-ahead
leaves a supervisor that reads end-of-file and runs nothing); the supervisor closes
all it does not need (the forker's socket too) and outlives the forker and the
service, for a restarted service to adopt. The forker ends at its socket's
end-of-file, when the service has gone. A request the forker could not have read
(it had died) is sent again to a new one; a forker that dies after reading one fails
that start: the service closes the go-ahead pipe, so a supervisor it may have forked
runs nothing, and the job never runs twice.
"""

from __future__ import annotations

import array
import contextlib
import json
import os
import signal
import socket
import struct
import sys
from typing import Any, Optional

from gpuwarden.base.errors import UserError

TYPE_CHECKING = False
if TYPE_CHECKING:
    import subprocess

    from gpuwarden.service.spawn import JobStart

_SIZE = struct.Struct("!I")  # a message's length, before it
#: A request's descriptors: report, go, three of stdio, the leases (two per GPU).
MOST_FDS = 250
#: Seconds a forker has to answer a request (it forks and reads /proc once).
ANSWER_WITHIN = 30.0
_MAIN = "from gpuwarden.service.forker import main; sys.exit(main(sys.argv))"


class Forker:
    """The service's handle on its forker: started on first need, started again once it
    is found gone. `fork` is the service's whole use of it."""

    def __init__(self) -> None:
        self.proc: Optional[subprocess.Popen[bytes]] = None
        self.sock: Optional[socket.socket] = None
        self.started = 0  # forkers started: more than one means one died
        self.forks = 0

    def warm(self) -> None:
        """Start the forker now (it imports while the service goes on)."""
        if self.sock is None:
            self._start()

    def fork(self, launch: JobStart, report_w: int, go_r: int) -> tuple[int, int, int]:
        """Fork `launch`'s supervisor, which holds `report_w` and `go_r` (the caller keeps
        and closes its own copies): its pid, start time and a pidfd of it. UserError
        when the forker died while it had the request (the start fails; nothing runs)."""
        payload = json.dumps(_encode(launch)).encode()
        fds = [report_w, go_r, *(launch.stdio or ()), *launch.keep]
        for attempt in (1, 2):
            self.warm()
            try:
                _send(self._sock(), payload, fds)
                break
            except OSError:  # it had died: it never read this request
                self._lost()
                if attempt == 2:
                    raise UserError("the service's forker could not be started") from None
        try:
            answer, got = _receive(self._sock(), 1, ANSWER_WITHIN)
        except (OSError, ValueError, EOFError) as err:
            self._lost()
            why = f"the service's forker died while forking a supervisor ({err})"
            raise UserError(why) from None
        if "error" in answer or len(got) != 1:
            for fd in got:
                os.close(fd)
            raise UserError(f"could not fork a supervisor: {answer.get('error')}")
        self.forks += 1
        return int(answer["pid"]), int(answer["since"]), got[0]

    def close(self) -> None:
        """Let the forker end (its socket's end-of-file); its supervisors run on."""
        self._lost()

    def stats(self) -> dict[str, int]:
        pid = self.proc.pid if self.proc else 0
        return {"pid": pid, "started": self.started, "forks": self.forks}

    def _sock(self) -> socket.socket:
        assert self.sock is not None
        return self.sock

    def _start(self) -> None:
        import subprocess

        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        # The service's own package, wherever it was loaded from: the forker runs its code.
        where = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        code = f"import sys; sys.path.insert(0, {where!r}); {_MAIN}"
        try:
            self.proc = subprocess.Popen(
                # -I: nothing from the service's environment or working directory is
                # imported (it runs as root); the package's place is given above.
                [sys.executable, "-I", "-c", code, str(theirs.fileno())],
                pass_fds=(theirs.fileno(),),
                stdin=subprocess.DEVNULL,
                cwd="/",
                start_new_session=True,  # a terminal's ^C is the service's to take
            )
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()
        self.sock = ours
        self.started += 1

    def _lost(self) -> None:
        if self.sock is not None:
            self.sock.close()
            self.sock = None
        if self.proc is not None:
            import subprocess

            try:  # at its end-of-file it ends at once, unless it is stuck
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.proc.kill()  # its supervisors, in sessions of their own, run on
                self.proc.wait()
            self.proc = None


def _encode(launch: JobStart) -> dict[str, Any]:
    """What the forker needs of `launch` but its descriptors (sent beside it)."""
    owner = launch.owner
    return {
        "job": launch.job,
        "argv": list(launch.argv),
        "owner": [owner.uid, owner.gid, owner.name, list(owner.groups), owner.home, owner.shell],
        "cwd": launch.cwd,
        "env": dict(launch.env),
        "status_dir": launch.status_dir,
        "umask": launch.umask,
        "output": launch.output,
        "stdio": launch.stdio is not None,
        "keep": len(launch.keep),
        "extra_env": dict(launch.extra_env),
        "minors": None if launch.minors is None else list(launch.minors),
        "present": list(launch.present),
        "devices": launch.devices,
        "caps": None if launch.caps is None else [launch.caps[0], list(launch.caps[1])],
    }


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


def _send(sock: socket.socket, payload: bytes, fds: list[int]) -> None:
    message = _SIZE.pack(len(payload)) + payload
    ancillary = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))] if fds else []
    sent = sock.sendmsg([message], ancillary)  # the descriptors go with the first byte
    if sent < len(message):
        sock.sendall(message[sent:])


def _receive(
    sock: socket.socket, most_fds: int, timeout: Optional[float] = None
) -> tuple[dict[str, Any], list[int]]:
    """One message and its descriptors; EOFError at the peer's end before one began."""
    sock.settimeout(timeout)
    size = socket.CMSG_SPACE(most_fds * array.array("i").itemsize)
    data, ancillary, flags, _ = sock.recvmsg(65536, size)
    fds: list[int] = []
    for level, kind, chunk in ancillary:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            got = array.array("i")
            got.frombytes(chunk[: len(chunk) - len(chunk) % got.itemsize])
            fds.extend(got)
    try:
        if not data:
            raise EOFError("the other end has closed")
        while len(data) < _SIZE.size:
            data += _more(sock)
        (length,) = _SIZE.unpack_from(data)
        while len(data) < _SIZE.size + length:
            data += _more(sock)
        if flags & socket.MSG_CTRUNC:  # read whole first: the next message starts clean
            raise ValueError("too many descriptors")
        message = json.loads(data[_SIZE.size : _SIZE.size + length])
        if not isinstance(message, dict):
            raise ValueError("not a message")
    except BaseException:
        for fd in fds:
            os.close(fd)
        raise
    return message, fds


def _more(sock: socket.socket) -> bytes:
    chunk = sock.recv(1 << 20)
    if not chunk:
        raise EOFError("the other end closed within a message")
    return chunk


# -- the forker process -------------------------------------------------------------


def serve(sock: socket.socket) -> None:
    """Fork a supervisor per request until the service's end of `sock` closes."""
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
            data, fds = _receive(sock, MOST_FDS)
        except EOFError:
            return
        except ValueError as err:
            _send(sock, json.dumps({"error": str(err)}).encode(), [])
            continue
        pidfd = -1
        try:
            pid, since, pidfd = _fork(spawn, data, fds, sock, children)
            answer: dict[str, Any] = {"pid": pid, "since": since}
        except Exception as err:  # said to the service, which fails that start
            answer = {"error": spawn._describe(err)}
        finally:
            for fd in fds:
                os.close(fd)
        try:
            _send(sock, json.dumps(answer).encode(), [pidfd] if pidfd >= 0 else [])
        except OSError:  # the service is gone: so is the go-ahead of what was forked
            return
        finally:
            if pidfd >= 0:
                os.close(pidfd)
        reap()


def _fork(
    spawn: Any, data: dict[str, Any], fds: list[int], sock: socket.socket, children: set[int]
) -> tuple[int, int, int]:
    """Fork the supervisor of the request `data`: its pid, start time and a pidfd."""
    launch = _decode(data, fds)
    where = spawn._ready(launch)
    pid = os.fork()
    if pid == 0:  # the supervisor
        code = 70
        try:
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            sock.close()
            code = spawn._supervise(launch, fds[0], fds[1], where)
        finally:
            os._exit(code)
    try:  # before any reaping of it: the pid, and what /proc says of it, are its own
        pidfd = os.pidfd_open(pid)
        return pid, spawn.start_time(pid), pidfd
    finally:
        children.add(pid)  # reaped from now on, whether the service heard of it or not


def main(argv: list[str]) -> int:
    """The forker: `argv[1]` is its socket's descriptor."""
    # What a supervisor and its job call, loaded once here, not after each fork.
    import fcntl  # noqa: F401
    import pwd  # noqa: F401
    import termios  # noqa: F401

    from gpuwarden.service import jobcgroup, spawn, tree  # noqa: F401

    with contextlib.suppress(ImportError, OSError):
        from gpuwarden.cgroups import bpf  # noqa: F401
    tree.ready()
    sock = socket.socket(fileno=int(argv[1]))
    serve(sock)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
