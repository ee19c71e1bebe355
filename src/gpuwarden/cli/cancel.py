"""`gpuwarden cancel [ID...] [--me | -u USER] [--state PENDING|RUNNING]`: end jobs of
this machine's queue, waiting or running (only their owner or an admin may), named by
id, by range (`12-20`) or, as Slurm's `scancel -u/-t`, by owner and state; `--slurm`:
Slurm jobs."""

from __future__ import annotations

import sys

TYPE_CHECKING = False
if TYPE_CHECKING:
    import argparse
    from typing import Any

    from gpuwarden.cli import Commands

#: Ids one range may name (`1-100000` is a typo more likely than a wish).
MAX_RANGE = 100_000
STATES = {"PENDING": ("PENDING",), "RUNNING": ("STARTING", "RUNNING")}


def register(commands: Commands, name: str) -> None:
    from gpuwarden.cli import subcommand

    parser = subcommand(commands, name)
    parser.add_argument("--slurm", action="store_true", help="Slurm job ids")
    who = parser.add_mutually_exclusive_group()
    who.add_argument("--me", action="store_true", help="all your jobs (with IDs: those of them)")
    who.add_argument("-u", "--user", metavar="USER", help="all of USER's jobs (admins)")
    parser.add_argument(
        "-t",
        "--state",
        type=str.upper,
        choices=sorted(STATES),
        help="only jobs in this state: PENDING (waiting) or RUNNING",
    )
    parser.add_argument(
        "ids",
        nargs="*",
        metavar="ID",
        help="job ids (12-20: a range; an array's id: all its tasks; 12_7: one task)",
    )


def run(args: argparse.Namespace) -> int:
    if args.slurm:
        return _slurm(args)
    from gpuwarden.base.errors import UserError
    from gpuwarden.cli import service_client
    from gpuwarden.cli.jobtables import acted
    from gpuwarden.queueclient.protocol import MAX_IDS

    selected = args.me or args.user is not None or args.state is not None
    names, ranges = split_ranges(args.ids)
    if not names and not ranges and not selected:
        raise UserError("name the jobs to cancel: IDs (12 13, 12-20), --me, -u USER or --state")
    with service_client() as client:
        if selected or ranges:
            names = _select(client, args, names, ranges)
            if not names:
                print("gpuwarden cancel: no job queued or running matches", file=sys.stderr)
                return 0
        done: list[Any] = []
        refused: list[Any] = []
        for start in range(0, len(names), MAX_IDS):
            try:
                reply = client.call("cancel", jobs=names[start : start + MAX_IDS])
            except UserError as err:
                if len(names) <= MAX_IDS:
                    raise
                refused.append({"error": str(err)})
                continue
            done += reply.get("names") or reply["jobs"]
            refused += reply.get("refused") or []
    return acted("cancel", "cancelled", done, refused)


def split_ranges(words: list[str]) -> tuple[list[int | str], list[tuple[int, int]]]:
    """The ids of the command line (`cancel`'s `job_names`), and its ranges (`12-20`)."""
    from gpuwarden.base.errors import UserError
    from gpuwarden.base.units import is_digits
    from gpuwarden.cli.jobtables import job_names

    plain: list[str] = []
    ranges: list[tuple[int, int]] = []
    for word in words:
        for part in word.split(","):
            low, dash, high = part.strip().partition("-")
            if not dash:
                plain.append(part)
                continue
            if not (is_digits(low) and is_digits(high)) or not 0 < int(low) <= int(high):
                raise UserError(
                    f"invalid job range {part.strip()!r}: expected FIRST-LAST, e.g. 12-20"
                )
            if int(high) - int(low) >= MAX_RANGE:
                raise UserError(f"job range {part.strip()!r} names over {MAX_RANGE} ids")
            ranges.append((int(low), int(high)))
    return job_names(plain), ranges


def _select(
    client: Any, args: argparse.Namespace, names: list[Any], ranges: list[Any]
) -> list[Any]:
    """The queued and running jobs the options select: by owner (--me: who the service
    says we are), by state, and among the given ids and ranges where some are given."""
    user = args.user
    if args.me:
        user = client.call("hello")["user"]
    filters = {} if user is None else {"user": user}
    rows, _ = client.listing("queue", **filters)
    states = STATES.get(args.state or "", ())
    wanted = {n for n in names if isinstance(n, int)}
    picked: list[Any] = []
    for row in rows:
        if user is not None and row.get("user") != user:
            continue
        if states and row.get("state") not in states:
            continue
        job = row["id"]
        if (names or ranges) and job not in wanted and not any(a <= job <= b for a, b in ranges):
            continue
        picked.append(job)
    # Tasks named as 12_7 are the service's to resolve; a bare id it will judge too.
    if not (args.me or args.user is not None or args.state is not None):
        picked += [n for n in names if not isinstance(n, int) or n not in picked]
    return sorted(set(picked), key=lambda n: (str(type(n)), n))


def _slurm(args: argparse.Namespace) -> int:
    from gpuwarden.base.errors import UserError
    from gpuwarden.slurm import tools

    if not args.ids:
        raise UserError("with --slurm, name the Slurm job ids")
    for job in args.ids:
        tools.check_id(job)
    for job in args.ids:
        tools.cancel(job)
        print(f"gpuwarden cancel: cancelled Slurm job {job}", file=sys.stderr)
    return 0
