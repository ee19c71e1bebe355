"""One client connection of the queue service, as the socket loop keeps it."""

from __future__ import annotations

import contextlib
import os
import socket
import time
from dataclasses import dataclass, field
from typing import Any, Optional

from gpuwarden.queueclient import protocol
from gpuwarden.service.identity import Person


@dataclass
class Connection:
    """One client's connection: its socket, who is on the other end (from the kernel),
    the bytes it has yet to read and the descriptors it passed with its last message."""

    sock: socket.socket
    who: Person
    decoder: protocol.Decoder = field(default_factory=protocol.Decoder)
    seen: float = field(default_factory=time.monotonic)
    fds: list[int] = field(default_factory=list)  # descriptors passed with the last message
    job: Optional[int] = None  # the attached job this connection waits for
    out: bytearray = field(default_factory=bytearray)  # answers the client has yet to read
    out_since: float = 0.0  # when `out` last stopped being empty
    backlog: list[dict[str, Any]] = field(default_factory=list)  # requests not yet answered
    # An answer of it promises what the journal holds only once fsynced: it leaves at
    # the end of the loop's turn, after one fsync for every submit of the turn
    # (Clients.release).
    promised: bool = False

    def take_fds(self) -> list[int]:
        fds, self.fds = self.fds, []
        return fds

    def close_fds(self) -> None:
        for fd in self.take_fds():
            with contextlib.suppress(OSError):
                os.close(fd)
