"""Talking to `gpuwarden serve` from the commands: one request, one answer.

The socket is `$GPUWARDEN_SOCKET`, else the configured `service.socket`, else
/run/gpuwarden/gpuwarden.sock. No service there (no socket, nobody listening)
is an ordinary answer (`None` from `connect`): the commands then work alone, as
on a workstation.
"""

from __future__ import annotations

import contextlib
import errno
import os
import socket
import sys

from gpuwarden.base.errors import UserError
from gpuwarden.queueclient import protocol

TYPE_CHECKING = False  # typing stays off the start-up path of `run` through the service
if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence
    from typing import Any, Optional

    from gpuwarden.placement.request import Request

DEFAULT_SOCKET = "/run/gpuwarden/gpuwarden.sock"
#: Seconds of silence from the service after which a waiting command says so.
NOTICE_AFTER = 3.0


_TOLD: list[str] = []  # the service's release, once this process was told of it


def _compare_release(theirs: object) -> None:
    """One line on stderr, once per process, when the service runs another release of
    gpuwarden than this client (a student's venv left behind by an upgrade): the
    protocol may still match, but what each says of the other may not. `gpuwarden
    doctor` prints the command that installs the service's own."""
    # The package is imported already (this module is in it): its version, with no
    # import of the package's own that would tie the client to the Python API.
    __version__ = sys.modules["gpuwarden"].__version__
    if theirs == __version__ or _TOLD or not isinstance(theirs, str):
        return
    import re

    if not re.fullmatch(r"[0-9A-Za-z.+!_-]{1,40}", theirs):
        return  # not a version: nothing worth printing
    _TOLD.append(theirs)
    where = os.path.dirname(os.path.dirname(sys.executable))
    print(
        f"gpuwarden: this client ({where}) is gpuwarden {__version__}, the service "
        f"{theirs}: install the service's into it (`gpuwarden doctor` says how)",
        file=sys.stderr,
        flush=True,
    )


class Client:
    def __init__(self, sock: socket.socket, path: str) -> None:
        self.sock = sock
        self.path = path
        self.decoder = protocol.Decoder()
        self.pending: list[dict[str, Any]] = []
        self.waiting = False  # an attached job's events: timeouts are the caller's to handle

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def call(self, op: str, **fields: Any) -> dict[str, Any]:
        """Send one request and return the answer; an error answer raises UserError."""
        message = {"v": protocol.VERSION, "op": op, **fields}
        try:
            self.sock.sendall(protocol.encode(message))
        except OSError as err:
            raise UserError(
                f"lost the connection to the service at {self.path}: {err.strerror}"
            ) from None
        reply = self.receive()
        if not reply.get("ok"):
            raise UserError(str(reply.get("error") or "the service refused the request"))
        return reply

    def listing(
        self, op: str, rows: Optional[int] = None, **filters: Any
    ) -> tuple[list[dict[str, Any]], dict[str, Any]]:
        """Up to `rows` rows of `queue` or `jobs` (None: all of them), asked a page at a
        time (no answer exceeds the protocol's page), and the last answer (its `total`
        says how many match). A job that moves between pages is listed once."""
        out: list[dict[str, Any]] = []
        seen: set[Any] = set()
        offset = 0
        while True:
            want = protocol.MAX_PAGE_ROWS if rows is None else rows - len(out)
            reply = self.call(op, offset=offset, limit=min(want, protocol.MAX_PAGE_ROWS), **filters)
            for row in reply.get("jobs") or ():
                if row.get("id") not in seen:
                    seen.add(row.get("id"))
                    out.append(row)
            more = reply.get("next")
            if (
                not isinstance(more, int)
                or more <= offset
                or (rows is not None and len(out) >= rows)
            ):
                return out[:rows] if rows is not None else out, reply
            offset = more

    def receive(self) -> dict[str, Any]:
        while not self.pending:
            try:
                data = self._recv()
            except TimeoutError:
                if self.waiting:
                    raise  # run_attached's own deadline: it decides what a quiet minute means
                raise UserError(
                    f"lost the connection to the service at {self.path}: "
                    f"no answer within {self.sock.gettimeout():g}s"
                ) from None
            except OSError as err:
                # A timeout's strerror is None: say what happened instead.
                why = err.strerror or f"no answer within {self.sock.gettimeout():g}s"
                raise UserError(
                    f"lost the connection to the service at {self.path}: {why}"
                ) from None
            if not data:
                raise UserError(f"the service at {self.path} closed the connection")
            self.pending.extend(self.decoder.feed(data))
        reply = self.pending.pop(0)
        if "release" in reply:
            _compare_release(reply["release"])
        return reply

    def _recv(self) -> bytes:
        """The next bytes from the service. A service answers in milliseconds; when it
        has said nothing for NOTICE_AFTER seconds (wedged, stopped, or an impostor
        that accepts and never answers), the user is told once on stderr while the
        rest of the timeout runs, rather than left looking at a silent terminal."""
        limit = self.sock.gettimeout()
        if self.waiting or limit is None or limit <= NOTICE_AFTER:
            return self.sock.recv(65536)
        try:
            self.sock.settimeout(NOTICE_AFTER)
            try:
                return self.sock.recv(65536)
            except TimeoutError:
                print(
                    f"gpuwarden: the service at {self.path} has not answered for "
                    f"{NOTICE_AFTER:g}s; waiting up to {limit:g}s",
                    file=sys.stderr,
                    flush=True,
                )
            self.sock.settimeout(limit - NOTICE_AFTER)
            return self.sock.recv(65536)
        finally:
            self.sock.settimeout(limit)  # also what a timeout's message reports


def connect(path: str, timeout: float = 30.0) -> Optional[Client]:
    """A client of the service at `path` (the caller's reading of `service.socket`), or
    None when no service runs there."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(timeout)
    try:
        sock.connect(path)
    except OSError as err:
        sock.close()
        if err.errno in (errno.ENOENT, errno.ECONNREFUSED, errno.ENOTDIR):
            return None
        raise UserError(f"cannot reach the service at {path}: {err.strerror}") from None
    return Client(sock, path)


def require(path: str) -> Client:
    """A client, or one line saying that this command needs the service."""
    client = connect(path)
    if client is None and os.path.lexists(path):
        # The socket is there and nobody listens: the service was killed, or crashed,
        # before it could remove it. Its jobs run on; new ones wait for its restart.
        raise UserError(
            f"the gpuwarden service does not answer at {path} (stopped or crashed, its "
            "socket left behind); an admin restarts it (`gpuwarden service status` says more)"
        )
    if client is None:
        raise UserError(
            f"no gpuwarden service runs on this machine ({path}); "
            "an admin starts one with `gpuwarden serve` (docs/service.md)"
        )
    return client


def run_attached(
    fields: dict[str, Any],
    path: str,
    timeout: Optional[float],
    quiet: bool = False,
    *,
    reconnect: float,
) -> int:
    """Submit a job that runs on this terminal, as `gpuwarden run` does without the
    service: its output is ours (our stdin, stdout and stderr are passed to the
    service with the request), Ctrl-C and other signals we get are passed on to the
    job, and the job's exit status is returned. While it waits for GPUs, one line
    says why; after `timeout` seconds of waiting it is cancelled (exit 75).

    A restart of the service ends no job: when the connection is lost we reconnect
    for up to `reconnect` seconds (`service.reconnect`) and attach to the job again,
    passing our terminal once more (a job still waiting needs it); signals that came
    in the gap are passed on then. A service that does not come back is said in one
    line; the job is then ended by the service when it returns and finds us gone."""
    import signal
    import time

    client = require(path)
    request = {"op": "submit", "attached": True, **fields}
    terminal = None
    if _in_the_foreground() and os.environ.get("GPUWARDEN_PTY") != "0":
        from gpuwarden.queueclient.terminal import Terminal

        terminal = Terminal.wanted()  # a terminal of the job's own (queueclient.terminal)
    ours = (0, 1, 2) if terminal is None else terminal.fds
    try:
        client, reply = _ask_with_terminal(client, request, reconnect, ours)
    except BaseException:
        if terminal is not None:
            terminal.close()
        raise
    if not reply.get("ok"):
        client.close()
        if terminal is not None:
            terminal.close()
        raise UserError(str(reply.get("error") or "the service refused the job"))
    job = int(reply["job"])
    state: dict[str, Any] = {"client": client, "missed": []}

    def send(op: str, **more: Any) -> bool:
        try:
            state["client"].sock.sendall(protocol.encode({"v": protocol.VERSION, "op": op, **more}))
        except OSError:
            return False
        return True

    def forward(signum: int, _frame: object) -> None:
        if not send("signal", job=job, signal=signum):
            state["missed"].append(signum)  # passed on once we are attached again

    forwarded = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT)
    previous = {s: signal.signal(s, forward) for s in forwarded}
    began = time.monotonic()
    started = said = timed_out = False
    try:
        while True:
            wait = None
            if not started:
                wait = 1.0 if not said else None
                if timeout is not None and not timed_out:
                    left = max(0.0, timeout - (time.monotonic() - began))
                    wait = left if wait is None else min(wait, left)
            state["client"].sock.settimeout(wait)
            state["client"].waiting = True
            try:
                event = state["client"].receive()
            except TimeoutError:
                if timeout is not None and time.monotonic() - began >= timeout:
                    timed_out = True
                    send("cancel", jobs=[job])
                elif not said and not quiet:
                    said = True
                    print(f"gpuwarden run: job {job} waits: {_reason(job, path)}", file=sys.stderr)
                continue
            except UserError:
                state["client"].close()
                state["client"] = _reattach(job, state["client"], reconnect, ours)
                while state["missed"]:
                    send("signal", job=job, signal=state["missed"].pop(0))
                continue
            if event.get("event") == "started":
                started = True
                if terminal is not None:
                    terminal.start()
            elif event.get("event") == "ended":
                if terminal is not None:
                    terminal.close()
                    terminal = None
                if timed_out and not started:
                    print(
                        f"gpuwarden run: gave up on job {job} after waiting {timeout:g}s for GPUs",
                        file=sys.stderr,
                    )
                    return 75
                if event.get("error"):
                    print(f"gpuwarden run: job {job}: {event['error']}", file=sys.stderr)
                return int(event.get("status", 1))
    finally:
        if terminal is not None:
            terminal.close()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        state["client"].close()


def _reason(job: int, path: str) -> str:
    """Why `job` waits, asked on a connection of its own (the attached one carries the
    job's events)."""
    with contextlib.suppress(UserError, OSError):
        client = connect(path, timeout=5.0)
        if client is not None:
            with client:
                for row in client.call("queue", ids=[job])["jobs"]:
                    if row["id"] == job:
                        return str(row.get("reason") or "queued")
    return "queued"


def _in_the_foreground() -> bool:
    """On a terminal (stdin and stdout), in its foreground: the job then gets a terminal
    of its own (queueclient.terminal). A run started with `&` leaves the terminal as
    it is: changing its mode from the background would stop us (SIGTTOU)."""
    try:
        return os.isatty(0) and os.isatty(1) and os.tcgetpgrp(0) == os.getpgrp()
    except OSError:
        return False


def _ask_with_terminal(
    client: Client, request: dict[str, Any], within: float, fds: Sequence[int] = (0, 1, 2)
) -> tuple[Client, dict[str, Any]]:
    """Send `request` with our stdin, stdout and stderr (`fds`) and read its answer; a
    connection lost on the way (the service restarting) is made again and the request
    sent again, for up to `within` seconds. A submit whose answer was lost may have
    been recorded: that copy never starts (no terminal came with it) and is cancelled
    once we are gone (service.attachment)."""
    import time

    deadline = time.monotonic() + within
    pause = 0.05
    while True:
        try:
            message = protocol.encode({"v": protocol.VERSION, **request})
            socket.send_fds(client.sock, [message], list(fds))
            return client, client.receive()
        except (UserError, OSError):
            client.close()
        while True:
            if time.monotonic() >= deadline:
                raise UserError(
                    f"lost the service at {client.path} and it did not come back within "
                    f"{within:g}s (service.reconnect)"
                    + (f"; job {request['job']} is ended when it does" if "job" in request else "")
                )
            time.sleep(pause)
            pause = min(1.0, pause * 2)
            again = None
            wait = max(1.0, min(30.0, deadline - time.monotonic()))
            with contextlib.suppress(UserError, OSError):
                again = connect(client.path, timeout=wait)
            if again is not None:
                client = again
                break


def _reattach(job: int, client: Client, within: float, fds: Sequence[int] = (0, 1, 2)) -> Client:
    """A connection attached to `job` again (the service restarted; it takes seconds);
    the answer's event, if any (the job started or ended meanwhile), is left for the
    caller's next `receive`. A job that runs needs no terminal (`fds=()`)."""
    client, reply = _ask_with_terminal(client, {"op": "attach", "job": job}, within, fds)
    if not reply.get("ok"):
        client.close()
        raise UserError(f"job {job}: {reply.get('error') or 'the service refused it'}")
    if reply.get("event"):
        client.pending.append(reply)
    return client


def job_fields(
    request: Request,
    argv: list[str],
    *,
    time_limit: Optional[float] = None,
    after: tuple[int, ...] = (),
    hold: bool = False,
    nice: int = 0,
    output: Optional[str] = None,
    warning: Optional[dict[str, Any]] = None,
    account: Optional[str] = None,
    place: Optional[tuple[str, Mapping[str, str], int]] = None,
) -> dict[str, Any]:
    """A submit request for `argv` with a `request.Request`'s GPU wishes, in this
    process's working directory, environment and umask (what the job runs with), or
    those `place` gives (cwd, env, umask); `account` the one it is charged to (None:
    the service's default for us)."""
    from gpuwarden.placement.requestwire import to_wire

    if place is None:
        mask = os.umask(0)
        os.umask(mask)
        place = (os.getcwd(), os.environ, mask)
    cwd, env, mask = place
    fields: dict[str, Any] = {
        "argv": list(argv),
        "cwd": cwd,
        "env": dict(env),
        "umask": mask,
        "request": to_wire(request),
        "nice": nice,
        "hold": hold,
    }
    if time_limit is not None:
        fields["time_limit"] = time_limit
    if after:
        fields["after"] = list(after)
    if output is not None:
        fields["output"] = os.path.normpath(os.path.join(cwd, output))
    if account:
        fields["account"] = account
    if warning is not None:
        fields["signal"] = warning
    return fields


def read_stats(path: str, timeout: float = 2.0) -> Optional[dict[str, Any]]:
    """The service's `stats`, or None when no service answers (never raises)."""
    try:
        client = connect(path, timeout=timeout)
        if client is None:
            return None
        with client:
            return client.call("stats")
    except (UserError, OSError, ValueError):
        return None
