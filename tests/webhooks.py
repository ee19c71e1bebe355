"""A webhook receiver for tests of what the service posts: it records each JSON body
with the uid of the process that sent it, so a test can tell a post made as the user
from one made as root (tests/test_job_notify.py, tests/test_service_digest.py)."""

from __future__ import annotations

import json
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any


def uid_of_peer(port: int) -> int:
    """The uid owning the loopback TCP socket bound to `port` (/proc/net/tcp)."""
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        if int(fields[1].split(":")[1], 16) == port:
            return int(fields[7])
    return -1


class Hook(BaseHTTPRequestHandler):
    """Records every POST's body in `Hook.got`, its sender's uid under `_uid`."""

    got: list[dict[str, Any]] = []  # noqa: RUF012 (the running test's record; it clears it)

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        body["_uid"] = uid_of_peer(self.client_address[1])
        Hook.got.append(body)
        self.send_response(204)
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass
