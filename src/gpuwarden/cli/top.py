"""`gpuwarden top`: the GPUs and the queue on one full screen, and keys that act on your
jobs (cancel, hold, release, requeue, follow the output) after a confirmation; admins
also drain and undrain. Works over plain ssh from 80×24, without colour (NO_COLOR)
and without a mouse (docs/top.md)."""

from __future__ import annotations

import sys

TYPE_CHECKING = False
if TYPE_CHECKING:
    import argparse
    from typing import Any, Optional

    from gpuwarden.cli import Commands

#: Seconds between readings (as nvitop's default).
INTERVAL = 2.0
HOSTS_INTERVAL = 10.0
#: Own jobs the line under the title summarises.
MINE = 20


def register(commands: Commands, name: str) -> None:
    from gpuwarden.cli import subcommand

    parser = subcommand(commands, name)
    parser.add_argument(
        "-d",
        "--interval",
        type=float,
        metavar="SECONDS",
        help=f"seconds between readings (default {INTERVAL:g}; {HOSTS_INTERVAL:g} with --hosts)",
    )
    who = parser.add_mutually_exclusive_group()
    who.add_argument("--me", action="store_true", help="only my jobs (m toggles)")
    who.add_argument("--user", metavar="NAME", help="only this user's jobs (/ changes it)")
    parser.add_argument(
        "--sort", choices=("queue", "user", "gpus", "waited"), default="queue", help="job order"
    )
    parser.add_argument(
        "--hosts",
        metavar="FILE|H1,H2",
        help="every listed host's GPUs and queue, over your ssh (docs/hosts.md)",
    )
    parser.add_argument(
        "--once",
        metavar="COLSxROWS",
        nargs="?",
        const="",
        help="print one screen as plain text and exit (default: the terminal's size)",
    )


def run(args: argparse.Namespace) -> int:
    from gpuwarden.base.errors import UserError
    from gpuwarden.top.model import State

    interval = args.interval
    if interval is None:
        interval = HOSTS_INTERVAL if args.hosts else INTERVAL
    if not 0.1 <= interval <= 3600:  # also NaN
        raise UserError(f"--interval needs 0.1 to 3600 seconds, got {interval:g}")
    state = State(mine=args.me, user=args.user, sort=args.sort)
    from gpuwarden import config

    socket = config.load().service_socket()
    read = _reader(args, socket)
    if args.once is not None:
        return _once(read, state, args.once)
    if not (sys.stdin.isatty() and sys.stdout.isatty()):
        raise UserError("top needs a terminal (--once prints one screen anywhere)")
    from gpuwarden.top import acting, terminal

    def perform(action: Any) -> str:
        return acting.perform(action, socket)

    terminal.run(read, perform, _log_tail, interval, state)
    return 0


def _reader(args: argparse.Namespace, socket: str) -> Any:
    """`read(state, room)`: the labs for a view in `state` showing `room` job rows (this
    machine's queue from the service at `socket`)."""
    from gpuwarden.lab.reading import read_hosts, read_lab

    if args.hosts is None:
        from gpuwarden.files.paths import user_name
        from gpuwarden.top.model import wanted_rows

        me = user_name()  # the kernel's uid, as the service names us
        return lambda state, room: [
            read_lab(
                socket,
                rows=wanted_rows(state, room),
                user=me if state.mine else state.user,
                mine=0 if state.mine else MINE,
            )
        ]
    from gpuwarden.hosts.remote import parse_hosts

    hosts = parse_hosts(args.hosts)
    return lambda state, room: read_hosts(hosts)


def _once(read: Any, state: Any, size: str) -> int:
    from gpuwarden.base.errors import UserError
    from gpuwarden.base.table import columns
    from gpuwarden.top.screen import draw

    width, height = columns(), 24
    if size:
        cols, _, rows = size.partition("x")
        if not (cols.isdigit() and rows.isdigit()):
            raise UserError(f"--once {size!r}: expected COLSxROWS, e.g. 80x24")
        width, height = int(cols), int(rows)
    for line in draw(read(state, height), state, width, height):
        print("".join(text for text, _ in line).rstrip())
    return 0


def _log_tail(host: Optional[str], job: str, lines: int) -> list[str]:
    """A job's last lines: from its output file here (its owner's or an admin's to
    read, the service says), or `gpuwarden logs` over ssh on another host."""
    from gpuwarden.base.errors import UserError

    if host is not None:
        from gpuwarden.hosts.remote import run_on, settings

        command, timeout, options = settings()
        said = run_on(host, [*command, "logs", job], timeout, options)
        return said.stdout.splitlines()[-lines:] if said.ok else [f"({said.error})"]
    from gpuwarden.cli import service_client
    from gpuwarden.jobs.output import tail

    try:
        with service_client() as client:
            reply = client.call("logs", job=int(job))
        if reply.get("attached"):
            return ["(it ran attached to a terminal: its output went there)"]
        found = tail(str(reply["output"]), int(reply["uid"]), lines)
        return found or ["(no output yet)"]
    except (UserError, OSError, ValueError) as err:
        return [f"({err})"]
