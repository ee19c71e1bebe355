"""`gpuwarden serve`: run the queue service for this machine (root; docs/service.md)."""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    import argparse

    from gpuwarden.cli.options import Parser


def add_arguments(parser: Parser) -> None:
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
        "--grace", metavar="DURATION", default="30s", help="SIGTERM to SIGKILL (30s)"
    )
    parser.add_argument(
        "--show-commands", action="store_true", help="show everyone's commands in queue"
    )
    parser.add_argument(
        "--log-level", default="INFO", choices=("DEBUG", "INFO", "WARNING", "ERROR")
    )


def run(args: argparse.Namespace) -> int:
    import logging
    import os

    from gpuwarden import scheduling
    from gpuwarden.config import parse_duration
    from gpuwarden.errors import UserError
    from gpuwarden.inventory import read_snapshot
    from gpuwarden.service.client import socket_path
    from gpuwarden.service.identity import Admins
    from gpuwarden.service.server import Service, Settings

    if os.geteuid() != 0:
        raise UserError("the service runs as root: it starts each job as the user who submitted it")
    logging.basicConfig(level=args.log_level, format="%(levelname)s %(name)s: %(message)s")
    for name, value in (
        ("--max-gpus-per-user", args.max_gpus_per_user),
        ("--max-jobs-per-user", args.max_jobs_per_user),
    ):
        if value is not None and value < 1:
            raise UserError(f"{name} must be 1 or more")
    settings = Settings(
        socket=args.socket or socket_path(),
        state_dir=args.state_dir
        or os.environ.get("GPUWARDEN_SERVICE_DIR")
        or "/var/lib/gpuwarden/service",
        policy=scheduling.Policy(max_gpus_per_user=args.max_gpus_per_user),
        admins=Admins.parse(args.admin or ()),
        max_jobs_per_user=args.max_jobs_per_user,
        max_time=None if args.max_time is None else parse_duration(args.max_time),
        show_commands=args.show_commands,
        grace=parse_duration(args.grace),
    )
    Service(settings, read_snapshot).serve_forever()
    return 0
