"""`gpuwarden queue` at the interpreter's own start: the service's table written as
it comes.

`queue`, `queue --all` and `queue --me` print the table the service writes
(service.queuetext), so the client has nothing to decode or draw: this one
imports what the interpreter has built in (`_socket`, `_json`, as
queueclient.thin for `submit`), asks for the table's pages and writes their
lines. Wherever it cannot stand in for the full client it steps aside (None)
before it prints a word: any other option, a settings file of the user's or the
project's, no service at the socket, a service of another release that answers
rows, a refusal, or lines above the table (GPU use outside the queue, bookings),
which the full client words.
"""

import os
import sys

from gpuwarden.files.configfiles import DEFAULT_SOCKET, project_config, user_config
from gpuwarden.queueclient.shortwire import TIMEOUT, answer, decoded, encoded

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Optional

#: Jobs `queue` shows without --all (the ones that start first).
PAGE = 500
MAX_PAGE_ROWS = 5000  # queueclient.protocol's
FLAGS = {"--all", "--me"}


def queue(argv: list[str]) -> "Optional[int]":
    """`gpuwarden queue [--all] [--me]` from the service's table: the exit code, the
    table written; None where the full client must run instead (nothing printed)."""
    if not set(argv) <= FLAGS or len(set(argv)) != len(argv):
        return None
    env = os.environ
    if os.path.lexists(user_config(env)) or project_config() is not None:
        return None
    path = env.get("GPUWARDEN_SOCKET", DEFAULT_SOCKET)
    if not path.strip():
        return None
    filters: dict[str, Any] = {}
    if "--me" in argv:
        import pwd

        try:
            filters["user"] = pwd.getpwuid(os.getuid()).pw_name
        except KeyError:
            return None  # no name: the full client says what it can
    import _socket

    sock = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
    try:
        sock.settimeout(TIMEOUT)
        try:
            sock.connect(os.path.abspath(path))
        except OSError:
            return None  # none there, or refused: the full client says so
        return _pages(sock, path, None if "--all" in argv else PAGE, filters)
    finally:
        sock.close()


def _pages(
    sock: "Any", path: str, rows: "Optional[int]", filters: "dict[str, Any]"
) -> "Optional[int]":
    offset = 0
    while True:
        want = MAX_PAGE_ROWS if rows is None else min(MAX_PAGE_ROWS, rows - offset)
        ask = {"v": 1, "op": "queue", "offset": offset, "limit": want, "arrays": True}
        try:
            sock.sendall(encoded({**ask, "table": True, **filters}))
            line = answer(sock, path)
            reply = decoded(line) if line else {}
        except (OSError, ValueError):
            reply = {}
        lines = reply.get("lines")
        if not reply.get("ok") or not isinstance(lines, list):
            if offset == 0:
                return None  # the full client asks again and says what went wrong
            sys.stderr.write(f"gpuwarden queue: the service at {path} stopped answering\n")
            return 1
        if offset == 0:
            if reply.get("unleased") or reply.get("bookings") or reply.get("bookings_total"):
                return None  # lines above the table: the full client's
            total = reply.get("total") or 0
            if rows is not None and total > rows:
                note = f"{rows} of {total} jobs shown; --all shows every one"
                sys.stderr.write(f"gpuwarden queue: {note}\n")
            sys.stdout.write(f"{reply.get('header')}\n" if total else "no jobs queued or running\n")
        if lines:
            sys.stdout.write("\n".join(lines) + "\n")
        more = reply.get("next")
        if not isinstance(more, int) or more <= offset or (rows is not None and more >= rows):
            return 0
        offset = more
