"""The small process that forks the jobs' supervisors, so that the service never forks.

A fork of the service (tens of MB of Python objects) marks each of its pages
copy-on-write, and the service's own reference counting then writes to most of them:
the service copied its pages back after every start, a few ms of its CPU per job, and
its loop is what bounds how fast jobs start. The forker is a fresh interpreter
(`python -I`, exec'd, not a fork of the service; service.forkerprocess) that imports
only what a supervisor runs (service.spawn and what it calls), started by the service
and again if it has died; it ends at its socket's end-of-file, when the service has gone.

It keeps a few supervisors forked ahead (spares), each waiting on a socket pair of
its own: the service has its pid, start time and a pidfd of it (taken before the forker,
which reaps it, could have), and the other end of its socket. A start sends the
launch (JSON, and by SCM_RIGHTS the report pipe's write end, the go-ahead pipe's read
end, an attached client's stdio, the lease descriptors) to a spare and asks the
forker for the next one, forked while the service goes on: no start waits for a fork.
Everything else is as when the service forked: the go-ahead pipe's write end stays in
the service alone (a service that dies before the go-ahead leaves a supervisor that
reads end-of-file and runs nothing); the supervisor closes all it does not need and
outlives the forker and the service, for a restarted service to adopt. A spare
that died before its launch is replaced; one that dies with part of it fails that
start; a spare whose service or forker let go of it exits having run nothing, so a
forker that died is simply started again, and no job ever runs twice.
"""

from __future__ import annotations

import array
import json
import os
import select
import socket
import struct
import sys
from dataclasses import dataclass
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
#: Supervisors kept forked ahead: the starts of one pass on a four-GPU machine, each
#: one a job, wait for no fork.
SPARES = 4
#: Supervisors kept waiting at most, recycled ones among them.
MOST_SPARES = 2 * SPARES
#: Milliseconds a start waits for a supervisor whose job has ended to say it can take
#: another (its exit record's fsync) before it asks the forker for a spare instead.
RECYCLED_WITHIN = 500
_MAIN = "from gpuwarden.service.forkerprocess import main; sys.exit(main(sys.argv))"


@dataclass
class Spare:
    """A supervisor waiting on its socket for the launch it is to run (forked ahead, or
    recycled): its pid, start time and pidfd, and the service's end of that socket.
    Once given a launch, whether the service is done with that job (`ended`) and
    whether it has said it can take another (`ready`)."""

    pid: int
    since: int
    pidfd: int
    sock: socket.socket
    ended: bool = False
    ready: bool = False

    def discard(self) -> None:
        """It reads end-of-file and exits, having run nothing (more)."""
        self.sock.close()
        os.close(self.pidfd)


class Forker:
    """The service's handle on its forker: started on first need, started again once it
    is found gone. `fork` is the service's whole use of it.

    The forker keeps `SPARES` supervisors forked ahead (`Spare`): a start sends its
    launch to one, which the service already knows by pid and pidfd, and asks for the
    next, forked while the service goes on, so no start waits for a fork. A spare
    request carries nothing that could run: a forker that dies with one is simply
    started again, and its spare, whose socket's other end it held, exits.

    A supervisor whose job has ended with nothing of it left (service.forkerprocess)
    waits for another launch on the same socket: once the service is done with that job
    (`ended`, called as it lets go of the job's supervisor), it is a spare again, taken
    before those never used. A job then costs no fork, no exit, and few pages copied:
    the supervisor's own copies of the pages its first job touched serve the next."""

    def __init__(self, status_dir: str = "") -> None:
        self.status_dir = status_dir  # where the jobs' cgroups are placed from (warmed)
        self.proc: Optional[subprocess.Popen[bytes]] = None
        self.sock: Optional[socket.socket] = None
        self.spares: list[Spare] = []  # forked ahead, their answers read
        self.asked = 0  # spares asked for whose answers are not read yet
        self.started = 0  # forkers started: more than one means one died
        self.forks = 0  # supervisors given a launch
        self.forked = 0  # spares the forker forked
        self.recycled = 0  # launches given to a supervisor whose job had ended
        self.busy: dict[int, Spare] = {}  # pid -> a supervisor given a launch
        self.polled: dict[int, int] = {}  # its socket -> pid, until it says it is ready
        self.poller = select.poll()

    def warm(self) -> None:
        """Start the forker and ask it for a spare now (it imports and forks while the
        service goes on)."""
        if self.sock is None:
            self._start()
        self._recycle()
        coming = sum(1 for spare in self.busy.values() if spare.ended)
        while len(self.spares) + self.asked + coming < SPARES:
            self._ask()

    def fork(self, launch: JobStart, report_w: int, go_r: int) -> tuple[int, int, int]:
        """Give `launch` to a supervisor, which holds `report_w` and `go_r` (the caller
        keeps and closes its own copies): its pid, start time and a pidfd of it, the
        caller's. UserError when none could be had, or when one died as it was given
        the launch (the start fails; it runs nothing)."""
        message = _framed(json.dumps(_encode(launch)).encode())
        fds = array.array("i", [report_w, go_r, *(launch.stdio or ()), *launch.keep])
        ancillary = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, fds)]
        for _ in range(3):
            spare = self._take()
            try:
                sent = spare.sock.sendmsg([message], ancillary)  # its descriptors with it
            except OSError:  # it had died before it read anything: another one runs it
                spare.discard()
                continue
            try:
                if sent < len(message):
                    spare.sock.sendall(message[sent:])
            except OSError:  # it died with part of the launch: never whole, never run
                spare.discard()
                raise UserError("a job's supervisor died as it was given the job") from None
            self.forks += 1
            spare.ended = spare.ready = False
            self.busy[spare.pid] = spare  # its socket kept: it may take another launch
            self.polled[spare.sock.fileno()] = spare.pid
            self.poller.register(spare.sock, select.POLLIN)
            self._ask_quietly()  # the next one is forked while the service goes on
            return spare.pid, spare.since, os.dup(spare.pidfd)
        raise UserError("no supervisor could be forked for the job")

    def ended(self, pid: int) -> None:
        """The service is done with the job the supervisor `pid` ran (its end read, its
        pidfd and report let go): from now on it may take another."""
        spare = self.busy.get(pid)
        if spare is not None:
            spare.ended = True
            if spare.ready:
                self._reuse(spare)

    def close(self) -> None:
        """Let the forker and its spare end (their sockets' end-of-file); the supervisors
        given a launch run on."""
        for spare in (*self.spares, *self.busy.values()):
            spare.discard()
        self.spares.clear()
        self.busy.clear()
        self.polled.clear()
        self.poller = select.poll()
        self._lost()

    def stats(self) -> dict[str, int]:
        pid = self.proc.pid if self.proc else 0
        return {
            "pid": pid,
            "started": self.started,
            "forks": self.forks,
            "forked": self.forked,
            "recycled": self.recycled,
            "spares": len(self.spares),
        }

    def _recycle(self) -> None:
        """Read what the supervisors given a launch have said: ready for another (one
        byte), a spare again if the service is done with its job; closed (it has
        exited, or will at its job's end): let go."""
        for fd, _ in self.poller.poll(0) if self.polled else ():
            spare = self.busy[self.polled[fd]]
            try:
                said = spare.sock.recv(1, socket.MSG_DONTWAIT)
            except BlockingIOError:
                continue
            except OSError:
                said = b""
            self.poller.unregister(fd)
            del self.polled[fd]
            if said != b"r":
                del self.busy[spare.pid]
                spare.discard()
                continue
            spare.ready = True
            if spare.ended:
                self._reuse(spare)

    def _reuse(self, spare: Spare) -> None:
        del self.busy[spare.pid]
        self.spares.insert(0, spare)  # its pages are its own already: taken first
        self.recycled += 1
        if len(self.spares) > MOST_SPARES:
            self.spares.pop().discard()  # the one waiting longest

    def _take(self) -> Spare:
        """A spare, the next answer read first where none is in hand (a wait only when
        starts come faster than the forker forks)."""
        for attempt in (1, 2):
            self._recycle()
            if not self.spares and any(s.ended and not s.ready for s in self.busy.values()):
                self.poller.poll(RECYCLED_WITHIN)  # an exit record on its way to the disk
                self._recycle()
            if not self.spares:
                try:
                    self.warm()
                    if not self.asked:  # those coming back did not come in time
                        self._ask()
                    answer, got = receive(self._sock(), 2, ANSWER_WITHIN)
                except (OSError, ValueError, EOFError) as err:
                    self._lost()  # it died with the request: asked again of a new one
                    if attempt == 2:
                        raise UserError(f"the service's forker died ({err})") from None
                    continue
                self.asked -= 1
                self.forked += 1
                if "error" in answer or len(got) != 2:
                    for fd in got:
                        os.close(fd)
                    raise UserError(f"could not fork a supervisor: {answer.get('error')}")
                sock = socket.socket(fileno=got[1])
                self.spares.append(Spare(int(answer["pid"]), int(answer["since"]), got[0], sock))
            return self.spares.pop(0)
        raise UserError("the service's forker could not be started")

    def _ask(self) -> None:
        request = json.dumps({"spare": self.status_dir}).encode()
        try:
            send(self._sock(), request, [])
        except OSError:  # found dead: a new one
            self._lost()
            self._start()
            send(self._sock(), request, [])
        self.asked += 1

    def _ask_quietly(self) -> None:
        try:
            self.warm()
        except OSError as err:  # the next start tries again, and fails if it must
            import logging

            logging.getLogger("gpuwarden.serve").warning("the forker is gone: %s", err)
            self._lost()

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
        self.asked = 0
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


def _framed(payload: bytes) -> bytes:
    return _SIZE.pack(len(payload)) + payload


def send(sock: socket.socket, payload: bytes, fds: list[int]) -> None:
    message = _framed(payload)
    ancillary = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))] if fds else []
    sent = sock.sendmsg([message], ancillary)  # the descriptors go with the first byte
    if sent < len(message):
        sock.sendall(message[sent:])


def receive(
    sock: socket.socket, most_fds: int, timeout: Optional[float] = None
) -> tuple[dict[str, Any], list[int]]:
    """One message and its descriptors; EOFError at the peer's end before one began.
    Read to its end and no further: requests sent together (a stream joins them) stay
    each whole for the next call (a read of all that had come lost them)."""
    sock.settimeout(timeout)
    size = socket.CMSG_SPACE(most_fds * array.array("i").itemsize)
    data, ancillary, flags, _ = sock.recvmsg(_SIZE.size, size, socket.MSG_CMSG_CLOEXEC)
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
            data += _more(sock, _SIZE.size - len(data))
        (length,) = _SIZE.unpack_from(data)
        while len(data) < _SIZE.size + length:
            data += _more(sock, _SIZE.size + length - len(data))
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


def _more(sock: socket.socket, most: int) -> bytes:
    chunk = sock.recv(most)
    if not chunk:
        raise EOFError("the other end closed within a message")
    return chunk
