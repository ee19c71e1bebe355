"""Talking to `gpuwarden serve` from the commands: one request, one answer.

The socket is `$GPUWARDEN_SOCKET`, else the configured `service.socket`, else
/run/gpuwarden/gpuwarden.sock. No service there (no socket, nobody listening)
is an ordinary answer (`None` from `connect`): the commands then work alone, as
on a workstation.
"""

from __future__ import annotations

import contextlib
import errno
import socket
import sys
from typing import Any, Optional

from gpuwarden.errors import UserError
from gpuwarden.service import protocol

DEFAULT_SOCKET = "/run/gpuwarden/gpuwarden.sock"


def socket_path() -> str:
    """`service.socket` (or GPUWARDEN_SOCKET, which sets it), read with the rest of
    the configuration."""
    from gpuwarden import config

    return str(config.load().get("service.socket") or DEFAULT_SOCKET)


class Client:
    def __init__(self, sock: socket.socket, path: str) -> None:
        self.sock = sock
        self.path = path
        self.decoder = protocol.Decoder()
        self.pending: list[dict[str, Any]] = []

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

    def receive(self) -> dict[str, Any]:
        while not self.pending:
            try:
                data = self.sock.recv(65536)
            except OSError as err:
                raise UserError(f"lost the connection to the service: {err.strerror}") from None
            if not data:
                raise UserError(f"the service at {self.path} closed the connection")
            self.pending.extend(self.decoder.feed(data))
        return self.pending.pop(0)


def connect(path: Optional[str] = None, timeout: float = 30.0) -> Optional[Client]:
    """A client of the service at `path`, or None when no service runs there."""
    path = path or socket_path()
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


def require(path: Optional[str] = None) -> Client:
    """A client, or one line saying that this command needs the service."""
    client = connect(path)
    if client is None:
        raise UserError(
            f"no gpuwarden service runs on this machine ({path or socket_path()}); "
            "an admin starts one with `gpuwarden serve` (docs/service.md)"
        )
    return client


def run_attached(fields: dict[str, Any], path: Optional[str] = None) -> int:
    """Submit a job that runs on this terminal, as `gpuwarden run` does without the
    service: its output is ours (our stdin, stdout and stderr are passed to the
    service with the request), Ctrl-C and other signals we get are passed on to the
    job, and the job's exit status is returned. If the connection is lost (the service
    restarted), the job runs on; we reconnect and wait for its end."""
    import signal

    client = require(path)
    message = {"v": protocol.VERSION, "op": "submit", "attached": True, **fields}
    socket.send_fds(client.sock, [protocol.encode(message)], [0, 1, 2])
    reply = client.receive()
    if not reply.get("ok"):
        client.close()
        raise UserError(str(reply.get("error") or "the service refused the job"))
    job = int(reply["job"])
    state = {"client": client}

    def forward(signum: int, _frame: object) -> None:
        with contextlib.suppress(OSError, UserError):
            sock = state["client"].sock
            sock.sendall(
                protocol.encode(
                    {"v": protocol.VERSION, "op": "signal", "job": job, "signal": signum}
                )
            )

    forwarded = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT)
    previous = {s: signal.signal(s, forward) for s in forwarded}
    try:
        while True:
            try:
                event = state["client"].receive()
            except UserError:
                state["client"].close()
                status = _wait_after_reconnect(job, path, state)
                if status is not None:
                    return status
                continue
            if event.get("event") == "ended":
                if event.get("error"):
                    print(f"gpuwarden run: job {job}: {event['error']}", file=sys.stderr)
                return int(event.get("status", 1))
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        state["client"].close()


def _wait_after_reconnect(job: int, path: Optional[str], state: dict[str, Any]) -> Optional[int]:
    """After a lost connection: reconnect (the service may be restarting) and poll the
    job until it has ended; its status from the journal."""
    import time

    while True:
        client = connect(path)
        if client is None:
            time.sleep(0.2)
            continue
        state["client"] = client
        try:
            while True:
                rows = client.call("queue")["jobs"] + client.call("jobs", limit=1000)["jobs"]
                row = next((r for r in rows if r["id"] == job), None)
                if row is None or row["state"] not in ("PENDING", "STARTING", "RUNNING"):
                    return _status_of(row)
                time.sleep(0.2)
        except UserError:
            client.close()
            time.sleep(0.2)


def _status_of(row: Optional[dict[str, Any]]) -> int:
    if row is None:
        return 1
    if row.get("signal"):
        return 128 + int(row["signal"])
    if row.get("exit_code") is not None:
        return int(row["exit_code"])
    if row.get("error"):
        print(f"gpuwarden run: job {row['id']}: {row['error']}", file=sys.stderr)
    return 1 if row.get("state") != "CANCELLED" else 143
