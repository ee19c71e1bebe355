"""`gpuwarden book -g N --start TIME --for SPAN [--user U | --group @G] --reason TEXT`:
GPUs kept free for a user or a group during a window (the queue service plans around
it: docs/sweeps.md); `book --list` shows the bookings, `book --cancel ID` ends one."""

from __future__ import annotations

import sys

from gpuwarden.base.errors import UserError

TYPE_CHECKING = False
if TYPE_CHECKING:
    import argparse

    from gpuwarden.cli import Commands


def register(commands: Commands, name: str) -> None:
    from gpuwarden.cli import subcommand

    parser = subcommand(commands, name)
    parser.usage = (
        "gpuwarden book -g N --start TIME --for SPAN [--user U | --group @G] --reason TEXT\n"
        "       gpuwarden book --list | --cancel ID"
    )
    parser.add_argument("-g", "--count", metavar="N", help="how many GPUs")
    parser.add_argument("--start", metavar="TIME", help="now+1hour, 16:00, 2026-12-24T09:00")
    parser.add_argument("--for", dest="length", metavar="SPAN", help="how long: 4h, 90m, 2d")
    whom = parser.add_mutually_exclusive_group()
    whom.add_argument("--user", metavar="NAME", help="for this user (admins; default: you)")
    whom.add_argument("--group", metavar="@GROUP", help="for the members of this group")
    parser.add_argument("--reason", metavar="TEXT", help="what it is for (shown to everyone)")
    parser.add_argument("--list", action="store_true", help="the bookings not yet over")
    parser.add_argument("--cancel", metavar="ID", help="cancel this booking")
    parser.add_argument("--json", action="store_true", help="with --list: as JSON")


def run(args: argparse.Namespace) -> int:
    from gpuwarden.cli import service_client

    if (args.list or args.cancel is not None) and (args.count or args.start or args.length):
        raise UserError("--list and --cancel take no -g, --start or --for")
    if args.cancel is not None:
        from gpuwarden.cli.jobtables import job_ids

        (booking,) = job_ids([args.cancel]) if "," not in args.cancel else [0]
        if not booking:
            raise UserError("--cancel takes one booking id")
        with service_client() as client:
            client.call("unbook", booking=booking)
        print(f"gpuwarden book: booking {booking} cancelled", file=sys.stderr)
        return 0
    if args.list:
        with service_client() as client:
            rows = client.call("bookings")["bookings"]
        if args.json:
            import json

            json.dump(rows, sys.stdout, indent=2)
            print()
        else:
            print(booking_table(rows))
        return 0
    return _book(args)


def _book(args: argparse.Namespace) -> int:
    import time

    from gpuwarden.base.units import is_digits, parse_duration
    from gpuwarden.cli import service_client
    from gpuwarden.planning.begintime import parse

    for flag, value in (("-g", args.count), ("--start", args.start), ("--for", args.length)):
        if not value:
            raise UserError(f"a booking needs {flag} (gpuwarden book -g 2 --start 16:00 --for 4h)")
    if not args.reason or not args.reason.strip():
        raise UserError("a booking needs --reason: say what it is for")
    if not is_digits(args.count.strip()) or int(args.count) < 1:
        raise UserError(f"invalid -g {args.count!r}: a whole number of GPUs, 1 or more")
    length = parse_duration(args.length)
    if length is None or length <= 0:
        raise UserError(f"invalid --for {args.length!r}: a length such as 4h, 90m or 2d")
    fields: dict[str, object] = {
        "count": int(args.count),
        "start": parse(args.start, time.time()),
        "length": float(length),
        "reason": args.reason.strip(),
    }
    if args.user:
        fields["user"] = args.user
    if args.group:
        fields["group"] = args.group.removeprefix("@")
    with service_client() as client:
        reply = client.call("book", **fields)
    print(reply["booking"])
    print(f"gpuwarden book: {describe(reply)} (`gpuwarden book --list`)", file=sys.stderr)
    return 0


def describe(row: dict[str, object]) -> str:
    import time

    start = time.strftime("%Y-%m-%d %H:%M", time.localtime(float(row["start"])))  # type: ignore[arg-type]
    end = time.strftime("%Y-%m-%d %H:%M", time.localtime(float(row["end"])))  # type: ignore[arg-type]
    return f"booking {row['booking']} from {start} to {end}"


def booking_table(rows: list[dict[str, object]]) -> str:
    from gpuwarden.base.table import render
    from gpuwarden.cli.jobtables import booking_rows

    if not rows:
        return "no bookings"
    return render(["ID", "GPUS", "FOR", "FROM", "TO", "BY", "REASON"], booking_rows(rows))
