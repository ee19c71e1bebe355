"""`gpuwarden jobs`: finished jobs with how they ended and the GPU-hours they used;
`--slurm`: Slurm's (sacct where slurmdbd runs, the controller's memory otherwise)."""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    import argparse

    from gpuwarden.cli import Commands


def register(commands: Commands, name: str) -> None:
    from gpuwarden.cli import subcommand

    parser = subcommand(commands, name)
    parser.add_argument("--slurm", action="store_true", help="Slurm's ended jobs")
    parser.add_argument("-n", "--last", type=int, default=50, metavar="N", help="how many (50)")
    parser.add_argument("--me", action="store_true", help="only my jobs")
    parser.add_argument("--user", metavar="NAME", help="only this user's jobs")
    parser.add_argument("--json", action="store_true", help="print JSON")
    parser.add_argument("--all", action="store_true", help="every finished job (not only --last)")


def run(args: argparse.Namespace) -> int:
    import json

    from gpuwarden.base.errors import UserError
    from gpuwarden.cli import service_client
    from gpuwarden.cli.jobtables import history_table
    from gpuwarden.files.paths import user_name

    if args.last < 1:
        raise UserError("--last must be 1 or more")
    user = user_name() if args.me else args.user
    if args.slurm:
        from gpuwarden.slurm.history import ended_jobs

        jobs, _source = ended_jobs(user, args.last)
        print(json.dumps(jobs, indent=2) if args.json else history_table(jobs))
        return 0
    filters = {} if user is None else {"user": user}  # chosen by the service: one page
    with service_client() as client:
        jobs, _ = client.listing("jobs", None if args.all else args.last, **filters)
    print(json.dumps(jobs, indent=2) if args.json else history_table(jobs))
    return 0
