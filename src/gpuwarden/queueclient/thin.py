"""`gpuwarden submit` in a few milliseconds: the command line handed to the service.

A submit is typed again and again (a sweep submits hundreds), and the full client
pays for argparse, json, socket and the settings' schema before it says a word:
several times the interpreter's own start. This client imports only what the
interpreter has built in (`_socket`, `_json`) and sends its command line with what
the job inherits (working directory, environment, umask, interpreter) and what the
kernel says about the output file as this user (`writable.probe`). The service
reads the command line with `submit`'s own grammar (`queueclient.submitting`, the
very parser of the full client), checks, journals, and answers the text to print
and the exit code (`service.argvsubmit`). Who submits is the kernel's word
(SO_PEERCRED), as for every request.

Wherever it cannot stand in for the full client it steps aside (None) before
anything is sent or journaled, and the full client runs as it always did: no
service at the socket, a service of another release or one that does not know
the request, a settings file of the user's or the project's (they are read and
trusted here, as the user), a system file this user cannot read, and whatever
the service says it does not take (`--slurm`, `--ddp`, `--dry-run`, `--help`, an
output file it has no facts for, a command line longer than it reads).
"""

from __future__ import annotations

import os
import sys

from gpuwarden.files.configfiles import DEFAULT_SOCKET, project_config, system_config, user_config
from gpuwarden.queueclient.writable import probe

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Optional

OP = "submit_argv"
TIMEOUT = 30.0  # as queueclient.client.connect's
NOTICE_AFTER = 3.0


def submit(argv: list[str]) -> Optional[int]:
    """`gpuwarden submit ARGV...` through the service: the exit code, its output
    written; None where the full client must run instead (nothing was sent)."""
    env = os.environ
    try:
        if not _settings_are_the_services(env):
            return None
        path = env.get("GPUWARDEN_SOCKET", DEFAULT_SOCKET)
        if not path.strip():
            return None
        path = os.path.abspath(path)
        data = _request(argv, path)
    except OSError:  # no working directory, say: the full client says so
        return None
    import _socket

    sock = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
    try:
        sock.settimeout(TIMEOUT)
        try:
            sock.connect(path)
        except OSError:
            return None  # none there, or refused: the full client says so
        return _ask(sock, path, data)
    finally:
        sock.close()


def _settings_are_the_services(env: Any) -> bool:
    """No settings file of the user's or the project's (the full client reads and
    judges them as the user), and a system file this user may read, as the full
    client would (the service, reading it as root, could where the user cannot)."""
    if os.path.lexists(user_config(env)) or project_config() is not None:
        return False
    system = system_config(env)
    return not os.path.lexists(system) or os.access(system, os.R_OK)


def _request(argv: list[str], path: str) -> bytes:
    from gpuwarden import __version__

    cwd = os.getcwd()
    mask = os.umask(0)
    os.umask(mask)
    probes = {cwd: probe(cwd)}
    output = _output_word(argv)
    if output is not None:
        where = os.path.normpath(os.path.join(cwd, output))
        probes[where] = probe(where)
    message = {
        "v": 1,
        "op": OP,
        "release": __version__,
        "socket": path,
        "args": argv,
        "cwd": cwd,
        "env": dict(os.environ),
        "umask": mask,
        "python": sys.executable,
        "probes": probes,
        # whether we see the system settings file: the service reads it only then
        "system_file": os.path.lexists(system_config(os.environ)),
    }
    return _encoded(message)


def _output_word(argv: list[str]) -> Optional[str]:
    """A guess at `--output`'s value, so that its facts go with the first message: the
    service reads the command line itself, and steps aside where the guess missed."""
    for i, word in enumerate(argv):
        if word == "--":
            return None
        if word.startswith("--output="):
            return word[len("--output=") :]
        if word == "--output" and i + 1 < len(argv):
            return argv[i + 1]
    return None


def _encoded(message: dict[str, Any]) -> bytes:
    """One line of the protocol (queueclient.protocol.encode's compact JSON), by the
    interpreter's own JSON encoder, without the json package (and its `re`)."""
    import _json

    def unknown(value: object) -> object:
        raise TypeError(f"{type(value).__name__} is not JSON")

    encode = _json.make_encoder(
        None, unknown, _json.encode_basestring_ascii, None, ":", ",", False, False, False
    )
    return "".join(encode(message, 0)).encode("ascii") + b"\n"


class _Reading:
    """What the interpreter's JSON scanner asks of its decoder: json.loads' defaults."""

    strict = True
    object_hook = None
    object_pairs_hook = None
    parse_float = float
    parse_int = int

    @staticmethod
    def parse_constant(name: str) -> object:
        raise ValueError(f"{name} is not JSON")


def _decoded(line: bytes) -> dict[str, Any]:
    import _json

    scanner: Any = _json.make_scanner  # typeshed wants a scanner as its context
    value, _ = scanner(_Reading)(line.decode("utf-8"), 0)
    return value if isinstance(value, dict) else {}


def _ask(sock: Any, path: str, data: bytes) -> Optional[int]:
    try:
        sock.sendall(data)
    except OSError:
        return None  # not taken: nothing was journaled
    try:
        line = _answer(sock, path)
    except OSError as err:
        why = err.strerror or f"no answer within {TIMEOUT:g}s"
        lost = f"lost the connection to the service at {path}: {why}"
        return _said("", f"gpuwarden submit: {lost}\n", 2)
    if not line:
        return _said("", f"gpuwarden submit: the service at {path} closed the connection\n", 2)
    try:
        reply = _decoded(line)
    except ValueError:
        reply = {}
    code = reply.get("code")
    if not isinstance(code, int) or not reply.get("ok"):
        return None  # a service that does not take command lines: nothing journaled
    return _said(str(reply.get("stdout") or ""), str(reply.get("stderr") or ""), code)


def _answer(sock: Any, path: str) -> bytes:
    """The answer's line; after NOTICE_AFTER seconds of silence the user is told once,
    as by the full client (queueclient.client.Client._recv)."""
    data = b""
    sock.settimeout(NOTICE_AFTER)
    told = False
    while not data.endswith(b"\n"):
        try:
            more = sock.recv(65536)
        except TimeoutError:
            if told:
                raise
            told = True
            sys.stderr.write(
                f"gpuwarden: the service at {path} has not answered for "
                f"{NOTICE_AFTER:g}s; waiting up to {TIMEOUT:g}s\n"
            )
            sys.stderr.flush()
            sock.settimeout(TIMEOUT - NOTICE_AFTER)
            continue
        if not more:
            return b""
        data += more
    return data


def _said(out: str, err: str, code: int) -> int:
    """Written as the full client prints (its stdout flushed at the exit)."""
    sys.stdout.write(out)
    sys.stderr.write(err)
    return code
