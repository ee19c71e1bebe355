"""`gpuwarden logs --slurm ID [-f]`: a Slurm job's output; `-f` follows it until the
job ends."""

from __future__ import annotations

from gpuwarden.errors import UserError

TYPE_CHECKING = False
if TYPE_CHECKING:
    import argparse

    from gpuwarden.cli import Commands


def register(commands: Commands, name: str) -> None:
    from gpuwarden.cli import subcommand

    parser = subcommand(commands, name)
    parser.add_argument("--slurm", action="store_true", help="a Slurm job id")
    parser.add_argument("-f", "--follow", action="store_true", help="follow until the job ends")
    parser.add_argument("id", metavar="ID", help="job id")


def run(args: argparse.Namespace) -> int:
    if not args.slurm:
        from gpuwarden.cli.submit import LOCAL_QUEUE

        raise UserError(LOCAL_QUEUE)
    from gpuwarden.slurm import logs

    return logs.show(args.id, follow=args.follow)
