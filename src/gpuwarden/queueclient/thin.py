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

import os
import sys

from gpuwarden.files.configfiles import DEFAULT_SOCKET, project_config, system_config, user_config
from gpuwarden.queueclient.shortwire import TIMEOUT, answer, decoded, encoded
from gpuwarden.queueclient.writable import probe

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Optional

OP = "submit_argv"


def submit(argv: list[str]) -> "Optional[int]":
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


def _settings_are_the_services(env: "Any") -> bool:
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
    return encoded(message)


def _output_word(argv: list[str]) -> "Optional[str]":
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


def _ask(sock: "Any", path: str, data: bytes) -> "Optional[int]":
    try:
        sock.sendall(data)
    except OSError:
        return None  # not taken: nothing was journaled
    try:
        line = answer(sock, path)
    except OSError as err:
        why = err.strerror or f"no answer within {TIMEOUT:g}s"
        lost = f"lost the connection to the service at {path}: {why}"
        return _said("", f"gpuwarden submit: {lost}\n", 2)
    if not line:
        return _said("", f"gpuwarden submit: the service at {path} closed the connection\n", 2)
    try:
        reply = decoded(line)
    except ValueError:
        reply = {}
    code = reply.get("code")
    if not isinstance(code, int) or not reply.get("ok"):
        return None  # a service that does not take command lines: nothing journaled
    return _said(str(reply.get("stdout") or ""), str(reply.get("stderr") or ""), code)


def _said(out: str, err: str, code: int) -> int:
    """Written as the full client prints (its stdout flushed at the exit)."""
    sys.stdout.write(out)
    sys.stderr.write(err)
    return code
