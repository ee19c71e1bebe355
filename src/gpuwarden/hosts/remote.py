"""Running one gpuwarden command on many hosts over the user's own SSH, in parallel.

Plain `ssh` with `BatchMode=yes`: the user's keys, agent and ~/.ssh/config apply, and a
host that would ask for a password fails at once instead of waiting for a terminal.
Each host gets `hosts.timeout` seconds, one wall-clock limit for connecting and the whole
command; past it ssh is killed and the host is one line of error. ssh's ConnectTimeout is
left unset: a second timer of the same length raced this one, and which fired first
decided what a frozen host's line said.
A host name comes from the user's list, so it is checked before it reaches ssh's
command line: a name starting with `-` would be an ssh option (`-oProxyCommand=...`).
"""

from __future__ import annotations

import os
import shlex
import subprocess
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Optional

from gpuwarden.base.errors import UserError
from gpuwarden.base.records import record

#: Bytes kept of a host's reply: a status of 64 GPUs is well under this; more is a fault.
MAX_REPLY = 16 << 20
#: Hosts asked at once: each is one ssh process, idle while the host answers.
PARALLEL = 32


@record
class HostReply:
    """What one host answered: its stdout when the command succeeded, else why not."""

    host: str
    ok: bool
    stdout: str = ""
    error: str = ""  # one line: ssh's or the remote command's last words, or a timeout


def parse_hosts(text: str) -> list[str]:
    """`--hosts`: a file of host names (one per line, `#` comments), or `h1,h2,...`.
    Each name as ssh takes it (`user@host`, an alias of ~/.ssh/config, an address)."""
    if os.path.isfile(text):
        from gpuwarden.files.safefiles import read_small  # its errors are one line each

        body = read_small(text, 1 << 20, what="host list")[0].decode("utf-8", "replace")
        names = [line.split("#", 1)[0].strip() for line in body.splitlines()]
        where = f"in {text}"
    else:
        names = [part.strip() for part in text.split(",")]
        where = "in --hosts"
    hosts = [n for n in names if n]
    if not hosts:
        raise UserError(f"no host names {where} (a file with one per line, or h1,h2,...)")
    for name in hosts:
        check_host(name, where)
    seen: list[str] = []
    for name in hosts:
        if name not in seen:
            seen.append(name)
    return seen


def check_host(name: str, where: str = "") -> None:
    """A name ssh reads as a destination, never as an option or a second word."""
    bad = (
        name.startswith("-")
        or len(name) > 255
        or any(c.isspace() or not c.isprintable() or c in "'\"`$;&|<>\\" for c in name)
    )
    if bad:
        raise UserError(f"not a host name{' ' + where if where else ''}: {name!r}")


def ssh_argv(host: str, remote: Sequence[str], options: Sequence[str]) -> list[str]:
    """ssh's command line: options first, `--`, the host, then the remote command as one
    string (ssh joins its words with spaces for the remote shell, so each is quoted)."""
    check_host(host)
    return [
        "ssh",
        "-o",
        "BatchMode=yes",
        "-o",
        "ServerAliveInterval=5",
        *options,
        "--",
        host,
        " ".join(shlex.quote(word) for word in remote),
    ]


def settings() -> tuple[list[str], float, list[str]]:
    """The remote command's first words, the timeout and extra ssh options, from config."""
    from gpuwarden import config

    cfg = config.load({})
    words = []
    for key in ("hosts.command", "hosts.ssh_options"):
        try:
            words.append(shlex.split(cfg.get(key) or ""))
        except ValueError as err:  # an unclosed quote
            raise UserError(f"{key} ({cfg.source(key)}): {err}") from None
    command, options = words
    return command or ["gpuwarden"], float(cfg.get("hosts.timeout")), options


def run_everywhere(hosts: Sequence[str], argv: Sequence[str]) -> list[HostReply]:
    """`gpuwarden ARGV` on every host at once; replies in the hosts' order."""
    command, timeout, options = settings()
    remote = [*command, *argv]
    with ThreadPoolExecutor(max_workers=max(1, min(PARALLEL, len(hosts)))) as pool:
        return list(pool.map(lambda h: run_on(h, remote, timeout, options), hosts))


def run_on(host: str, remote: Sequence[str], timeout: float, options: Sequence[str]) -> HostReply:
    argv = ssh_argv(host, remote, options)
    try:
        done = subprocess.run(
            argv,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            timeout=timeout,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return HostReply(host, False, error=f"no answer within {timeout:g} s")
    except OSError as err:
        return HostReply(host, False, error=f"cannot run ssh: {err.strerror or err}")
    out = done.stdout[:MAX_REPLY].decode("utf-8", "replace")
    if done.returncode != 0:
        return HostReply(host, False, stdout=out, error=last_line(done.stderr, done.returncode))
    return HostReply(host, True, stdout=out)


def last_line(stderr: bytes, code: int) -> str:
    """The last non-empty line of stderr (ssh's or gpuwarden's one-line error), printable."""
    from gpuwarden.files.safefiles import printable

    text = stderr[-4096:].decode("utf-8", "replace")
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    line = lines[-1] if lines else f"exit status {code}"
    return printable(line)[:300]


def parse_json(reply: HostReply) -> tuple[Optional[Any], str]:
    """A reply's JSON document, or why there is none."""
    from gpuwarden.queueclient.depth import TooDeep, loads

    if not reply.ok:
        return None, reply.error
    try:
        return loads(reply.stdout), ""  # a host's answer may be hostile: bounded
    except TooDeep as err:
        return None, f"answered JSON {err}: refused"
    except ValueError:
        return None, "did not answer with JSON (an old gpuwarden there?)"


def ask_json(hosts: Sequence[str], argv: Sequence[str]) -> list[tuple[str, Optional[Any], str]]:
    """(host, its JSON document or None, why not) for `gpuwarden ARGV` on every host."""
    return [(r.host, *parse_json(r)) for r in run_everywhere(hosts, argv)]
