"""`gpuwarden cancel ID...`: end jobs of this machine's queue, waiting or running (only
their owner or an admin may); `--slurm`: Slurm jobs."""

from __future__ import annotations

import sys

TYPE_CHECKING = False
if TYPE_CHECKING:
    import argparse

    from gpuwarden.cli import Commands


def register(commands: Commands, name: str) -> None:
    from gpuwarden.cli import subcommand

    parser = subcommand(commands, name)
    parser.add_argument("--slurm", action="store_true", help="Slurm job ids")
    parser.add_argument(
        "ids", nargs="+", metavar="ID", help="job ids (an array's id: all its tasks; 12_7: one)"
    )


def run(args: argparse.Namespace) -> int:
    if not args.slurm:
        from gpuwarden.cli.jobtables import job_names, report_refused
        from gpuwarden.service.client import require

        ids = job_names(args.ids)
        with require() as client:
            reply = client.call("cancel", jobs=ids)
        print(f"cancelled: {', '.join(str(i) for i in reply.get('names') or reply['jobs'])}")
        return report_refused("cancel", reply)
    from gpuwarden.slurm import tools

    for job in args.ids:
        tools.check_id(job)
    for job in args.ids:
        tools.cancel(job)
        print(f"gpuwarden cancel: cancelled Slurm job {job}", file=sys.stderr)
    return 0
