"""Talking to `gpuwarden serve` from the commands: one request, one answer.

The socket is `$GPUWARDEN_SOCKET`, else the configured `service.socket`, else
/run/gpuwarden/gpuwarden.sock. No service there (no socket, nobody listening)
is an ordinary answer (`None` from `connect`): the commands then work alone, as
on a workstation.
"""

from __future__ import annotations

import errno
import os
import socket
from typing import Any, Optional

from gpuwarden.errors import UserError
from gpuwarden.service import protocol

DEFAULT_SOCKET = "/run/gpuwarden/gpuwarden.sock"


def socket_path() -> str:
    return os.environ.get("GPUWARDEN_SOCKET") or DEFAULT_SOCKET


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
