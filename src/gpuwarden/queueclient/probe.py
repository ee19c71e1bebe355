"""Is a service running here, can this user reach it, and does it speak our protocol?

Asked by `gpuwarden service status` and gathered by `gpuwarden doctor`. The answer is a
plain dict (it is printed as JSON as it is), and every failure is a value, never an
exception: a stale socket, a socket this user may not open, a service of another
protocol version or one that does not answer in time are things to report.
"""

from __future__ import annotations

import errno
import json
import os
import socket
import stat
import time
from collections.abc import Callable
from typing import Any, Optional

from gpuwarden.queueclient import protocol

#: Where `gpuwarden service install` puts the unit: there, the service is installed.
UNIT_PATH = "/etc/systemd/system/gpuwarden.service"
TIMEOUT = 3.0  # a service that takes longer to say hello is reported as not answering

# Why no service answered (the `problem` field):
ABSENT = "absent"  # no socket: no service on this machine
NOT_SOCKET = "not-a-socket"  # something else at the socket's path
REFUSED = "refused"  # a socket nobody listens on: the service died or was stopped
DENIED = "denied"  # this user may not open it (modes of the socket or its directory)
SILENT = "silent"  # connected, but no answer within TIMEOUT
OTHER_VERSION = "other-version"  # it answers, in another protocol version
BROKEN = "broken"  # anything else, with the error


def probe(where: str, timeout: float = TIMEOUT) -> dict[str, Any]:
    """Say hello to the service at `where` and, when it answers, count its jobs."""
    found: dict[str, Any] = {
        "socket": where,
        "running": False,
        "problem": None,
        "error": None,
        "version": None,
        "client_version": protocol.VERSION,
        "user": None,
        "admin": None,
        "jobs": None,
    }

    def fail(problem: str, error: str) -> dict[str, Any]:
        found.update(problem=problem, error=error)
        return found

    try:
        st = os.stat(where)
    except FileNotFoundError:
        return fail(ABSENT, "no service: its socket does not exist")
    except PermissionError:
        return fail(DENIED, "permission denied on the socket's directory")
    except OSError as err:
        return fail(BROKEN, f"cannot look at the socket: {err.strerror}")
    if not stat.S_ISSOCK(st.st_mode):
        return fail(NOT_SOCKET, "something other than a socket is at the socket's path")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(timeout)
    try:
        try:
            sock.connect(where)
        except OSError as err:
            if err.errno == errno.ECONNREFUSED:
                return fail(REFUSED, "a socket is there but no service listens on it")
            if err.errno in (errno.EACCES, errno.EPERM):
                return fail(DENIED, "permission denied: this user may not open the socket")
            return fail(BROKEN, f"cannot connect: {err.strerror}")
        try:
            hello = _call(sock, "hello")
        except TimeoutError:
            return fail(SILENT, f"the service did not answer within {timeout:g} s")
        except (OSError, ValueError) as err:
            return fail(BROKEN, f"the service did not answer: {err}")
        found["running"] = True
        found["version"] = hello.get("version", hello.get("v"))
        if not hello.get("ok"):
            return fail(OTHER_VERSION, str(hello.get("error") or "it refused hello"))
        found.update(user=hello.get("user"), admin=hello.get("admin"))
        found.update(release=hello.get("release"), wheels=hello.get("wheels"))
        try:
            queue = _call(sock, "queue")
        except (OSError, ValueError):
            return found
        if queue.get("ok") and isinstance(queue.get("jobs"), list):
            counts: dict[str, int] = {}
            for row in queue["jobs"]:
                state = str(row.get("state")) if isinstance(row, dict) else "?"
                if isinstance(row, dict) and row.get("held"):
                    state = "HELD"
                counts[state] = counts.get(state, 0) + 1
            found["jobs"] = counts
        return found
    finally:
        sock.close()


def wait_until_running(
    path: str,
    timeout: float,
    alive: Optional[Callable[[], bool]] = None,
    poll: float = 0.02,
) -> dict[str, Any]:
    """`probe(path)` again and again until the service answers, `alive()` turns False
    (the process that was to serve there has exited) or `timeout` seconds pass; the
    last answer, whose `running` says which. For whoever has just started a service
    and must know it serves: `service install`, the tour, the tests and benches."""
    deadline = time.monotonic() + timeout
    while True:
        found = probe(path)
        if found["running"] or (alive is not None and not alive()):
            return found
        if time.monotonic() >= deadline:
            return found
        time.sleep(poll)


def _call(sock: socket.socket, op: str) -> dict[str, Any]:
    """One request and its answer. ValueError for an answer that is not one."""
    sock.sendall(protocol.encode({"v": protocol.VERSION, "op": op}))
    buffered = b""
    while True:
        data = sock.recv(65536)
        if not data:
            raise ValueError("it closed the connection")
        buffered += data
        if b"\n" not in buffered:
            if len(buffered) > protocol.MAX_MESSAGE:
                raise ValueError("its answer is too large")
            continue
        line = buffered.split(b"\n", 1)[0]
        try:
            reply = json.loads(line.decode("utf-8"))
        except (UnicodeDecodeError, ValueError):
            raise ValueError("its answer is not JSON") from None
        if not isinstance(reply, dict):
            raise ValueError("its answer is not a JSON object")
        return reply
