"""`submit_argv`: a `gpuwarden submit` command line, read and submitted here.

The short client (`queueclient.thin`) sends the words after `submit` with what the
job inherits (working directory, environment, umask, interpreter) and what the
kernel told it about the output file (`queueclient.writable.probe`). They are read
with `submit`'s own grammar and checks (`queueclient.submitting`, the full client's),
under the settings the client would have read (the system file, which must be this
service's own, its `GPUWARDEN_*` variables, its command line), and the fields that
come out go through the ordinary `submit` request: its validation, its rules for
the person the kernel named, its journal. So a peer that sends this can do no more
than one that sends `submit` itself. The answer is the text the full client would
have printed and its exit code.

What only the full client can do is answered `fallback` before anything is
journaled, and the client runs the full client instead: another release (its
grammar may differ), `--help`, `--slurm`, `--ddp` (it reads the script and finds
torch as the user), `--dry-run`, another system settings file or socket (or one the
client does not see), an output file the client sent no facts for, a command line
longer than argparse reads quickly.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, NoReturn, Optional

from gpuwarden import config
from gpuwarden.base.checked import (
    ProtocolError,
    checked_bool,
    checked_int,
    checked_path,
    checked_string,
    checked_strings,
)
from gpuwarden.base.errors import UserError
from gpuwarden.files.configfiles import system_config
from gpuwarden.queueclient import protocol, submitting, writable
from gpuwarden.service import submitting as journaling

if TYPE_CHECKING:
    from gpuwarden.service.connection import Connection
    from gpuwarden.service.context import Context
    from gpuwarden.service.identity import Person


class _Fallback(Exception):
    """The full client must do this one."""


class _Refused(Exception):
    """argparse's refusal: its usage and error lines (exit status 2)."""


class _Parser(argparse.ArgumentParser):
    """`submit`'s parser as the CLI makes it (no abbreviations), that prints nothing
    and never exits: help and errors become exceptions."""

    def __init__(self) -> None:
        super().__init__(prog="gpuwarden submit", allow_abbrev=False)

    def _print_message(self, message: str, file: Any = None) -> None:
        pass

    def exit(self, status: int = 0, message: Optional[str] = None) -> NoReturn:
        raise _Fallback("help")  # -h: the full client prints it, to the user's terminal

    def error(self, message: str) -> NoReturn:
        raise _Refused(f"{self.format_usage()}{self.prog}: error: {message}\n")


#: The most words, and words that look like options before `--`, read here: argparse
#: takes time quadratic in the second (1,000 of them: 0.16 s), and the service serves
#: everyone from one thread. Longer command lines are read by the full client, in
#: the submitter's own process.
MAX_WORDS = 4096
MAX_DASHED = 64


def cheap(words: list[str]) -> bool:
    """Whether argparse reads `words` in a few milliseconds at most."""
    if len(words) > MAX_WORDS:
        return False
    dashed = 0
    for word in words:
        if word == "--":
            break
        dashed += word.startswith("-")
    return dashed <= MAX_DASHED


_PARSER: list[_Parser] = []


def _parser() -> _Parser:
    """One parser, made once: reading a command line changes nothing in it."""
    if not _PARSER:
        parser = _Parser()
        submitting.declare(parser)
        _PARSER.append(parser)
    return _PARSER[0]


def _environment(value: object) -> dict[str, str]:
    if not isinstance(value, dict) or len(value) > protocol.MAX_ENV:
        raise ProtocolError("env must be an object of at most MAX_ENV strings")
    for key, val in value.items():
        checked_string(key, "env name", 4096)
        checked_string(val, "env value", protocol.MAX_MESSAGE, empty=True)
    return dict(value)


def _probes(value: object) -> dict[str, list[bool]]:
    if not isinstance(value, dict) or len(value) > 4:
        raise ProtocolError("probes must be an object of at most 4 paths")
    for key, facts in value.items():
        checked_path(key, "probed path")
        if not isinstance(facts, list) or len(facts) != 5:
            raise ProtocolError("a probe is 5 facts")
        if not all(isinstance(f, bool) for f in facts):
            raise ProtocolError("a probe's facts are true or false")
    return dict(value)


def submit_argv(
    ctx: Context,
    who: Person,
    message: Mapping[str, Any],
    client: Optional[Connection],
) -> dict[str, Any]:
    from gpuwarden import __version__

    if message.get("release") != __version__:
        return {"ok": True, "fallback": f"this service is gpuwarden {__version__}"}
    words = list(checked_strings(message.get("args"), "args", protocol.MAX_WORDS))
    place = submitting.Place(
        checked_path(message.get("cwd"), "cwd"),
        _environment(message.get("env")),
        checked_int(message.get("umask"), "umask", 0, 0o777),
        checked_path(message.get("python"), "python"),
    )
    probes = _probes(message.get("probes"))
    socket = checked_path(message.get("socket"), "socket")
    seen = checked_bool(message.get("system_file"), "system_file")
    try:
        fields, tasks = _read(ctx.life.settings.socket, words, place, probes, (socket, seen))
    except _Fallback as why:
        return {"ok": True, "fallback": str(why)}
    except _Refused as refused:
        return {"ok": True, "code": 2, "stdout": "", "stderr": str(refused)}
    except UserError as err:
        return {"ok": True, "code": err.exit_code, "stdout": "", "stderr": _line(err)}
    try:  # read and judged as a `submit` request sent as it is
        sub = protocol.submit({"v": protocol.VERSION, "op": "submit", **fields})
        reply = journaling.submit(ctx.life, who, sub, client, ctx.judged)
    except UserError as err:  # as the full client is told: one line, status 2
        return {"ok": True, "code": 2, "stdout": "", "stderr": _line(err)}
    out, told = submitting.said(reply["job"], tasks)
    return {"ok": True, "code": 0, "stdout": out, "stderr": told, "job": reply["job"]}


def _line(err: UserError) -> str:
    return f"gpuwarden submit: {err}\n"


def _read(
    ours: str,
    words: list[str],
    place: submitting.Place,
    probes: Mapping[str, list[bool]],
    seen: tuple[str, bool],
) -> tuple[dict[str, Any], int]:
    """The submit request the full client would send for `words`, checked as it checks."""
    if not cheap(words):
        raise _Fallback("a command line longer than the service reads")
    parser = _parser()
    args, extra = parser.parse_known_args(words)
    if extra:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    submitting.first_checks(args)
    for flag in ("slurm", "ddp", "dry_run"):
        if getattr(args, flag):
            raise _Fallback(f"--{flag.replace('_', '-')}")
    settings = submitting.local_settings(args)
    socket, client_sees_system = seen
    system = system_config(os.environ)
    if system_config(place.env) != system or os.path.lexists(system) != client_sees_system:
        raise _Fallback("another system settings file, or one the client cannot see")
    layers: list[tuple[str, Optional[str]]] = []
    if client_sees_system:
        from gpuwarden.config.trust import refusal

        if refusal(system) is not None:
            raise _Fallback("a system settings file this service does not read")
        layers.append(("system", system))
    conf = config.load(settings, environ=place.env, cwd=place.cwd, layers=layers)
    if conf.service_socket() != socket or socket != ours:
        raise _Fallback("another socket")
    fields, tasks = submitting.fields_of(args, conf, place)
    path = writable.where(args.output, place.cwd)
    facts = probes.get(path)
    if facts is None:
        raise _Fallback("no facts about the output file")
    writable.judge(args.output, path, facts)
    return fields, tasks
