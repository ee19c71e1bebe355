"""`gpuwarden serve`: run the queue service for this machine (root; docs/service.md)."""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    import argparse

    from gpuwarden.cli import Commands


def register(commands: Commands, name: str) -> None:
    import argparse

    from gpuwarden.cli import LOG_LEVELS, subcommand

    parser = subcommand(commands, name)
    parser.add_argument(
        "--socket", metavar="PATH", help="Unix socket to serve (default: service.socket)"
    )
    parser.add_argument(
        "--state-dir",
        metavar="DIR",
        help="journal and job records (default /var/lib/gpuwarden/service)",
    )
    parser.add_argument(
        "--admin", action="append", metavar="USER|@GROUP", help="an admin (repeatable)"
    )
    parser.add_argument(
        "--max-gpus-per-user", type=int, metavar="N", help="GPUs a user may use at once"
    )
    parser.add_argument(
        "--max-jobs-per-user", type=int, metavar="N", help="jobs a user may have queued"
    )
    parser.add_argument(
        "--max-time", metavar="DURATION", help="longest --time allowed (then required)"
    )
    parser.add_argument(
        "--grace", metavar="DURATION", help="SIGTERM to SIGKILL (default: service.grace, 30s)"
    )
    parser.add_argument(
        "--show-commands", action="store_true", help="show everyone's commands in queue"
    )
    # The global `gpuwarden --log-level`, also accepted after the command as it always
    # was; SUPPRESS leaves the global value in place when it is not given here.
    parser.add_argument(
        "--log-level",
        type=str.lower,
        choices=LOG_LEVELS,
        default=argparse.SUPPRESS,
        metavar="LEVEL",
        help="what the service logs: debug, info (default), warning or error",
    )


def run(args: argparse.Namespace) -> int:
    import os

    from gpuwarden.base.errors import UserError
    from gpuwarden.base.units import parse_duration
    from gpuwarden.service.server import Service

    if os.geteuid() != 0:
        raise UserError("the service runs as root: it starts each job as the user who submitted it")
    for name, value in (
        ("--max-gpus-per-user", args.max_gpus_per_user),
        ("--max-jobs-per-user", args.max_jobs_per_user),
    ):
        if value is not None and value < 1:
            raise UserError(f"{name} must be 1 or more")
    # The command line's values stay over the files' at every reload.
    options = {
        "service.max_gpus_per_user": args.max_gpus_per_user,
        "service.max_jobs_per_user": args.max_jobs_per_user,
        "service.max_time": args.max_time,
        "service.grace": None if args.grace is None else parse_duration(args.grace),
        "service.show_commands": True if args.show_commands else None,
    }
    fixed = {"socket": args.socket, "state_dir": args.state_dir}
    service = Service.configured(options, fixed, tuple(args.admin or ()))
    service.serve_forever()
    return 0
