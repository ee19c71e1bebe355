"""`gpuwarden cancel --slurm ID...`: end Slurm jobs, pending or running."""

from __future__ import annotations

import sys

from gpuwarden.errors import UserError

TYPE_CHECKING = False
if TYPE_CHECKING:
    import argparse

    from gpuwarden.cli import Commands


def register(commands: Commands, name: str) -> None:
    from gpuwarden.cli import subcommand

    parser = subcommand(commands, name)
    parser.add_argument("--slurm", action="store_true", help="Slurm job ids")
    parser.add_argument("ids", nargs="+", metavar="ID", help="job ids")


def run(args: argparse.Namespace) -> int:
    if not args.slurm:
        from gpuwarden.cli.submit import LOCAL_QUEUE

        raise UserError(LOCAL_QUEUE)
    from gpuwarden.slurm import tools

    for job in args.ids:
        tools.check_id(job)
    for job in args.ids:
        tools.cancel(job)
        print(f"gpuwarden cancel: cancelled Slurm job {job}", file=sys.stderr)
    return 0
