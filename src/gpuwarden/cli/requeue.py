"""`gpuwarden requeue ID...`: run batch jobs again under their ids, as `scontrol requeue`.

A running job gets SIGTERM (SIGKILL after the service's grace) and waits again once it
has ended; an ended one waits again at once. Either keeps its id, its priority and its
output file (the next run appends), and its next run sees GPUWARDEN_RESTART_COUNT one
higher. Only the job's owner or an admin may (the service checks); attached jobs
(`run`) are not requeued.
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    import argparse

    from gpuwarden.cli import Commands


def register(commands: Commands, command_name: str) -> None:
    from gpuwarden.cli import subcommand

    parser = subcommand(commands, command_name)
    parser.add_argument("ids", nargs="+", metavar="ID", help="job ids (from `gpuwarden queue`)")


def run(args: argparse.Namespace) -> int:
    import sys

    from gpuwarden.cli.jobtables import job_ids
    from gpuwarden.errors import UserError
    from gpuwarden.queueclient.client import require
    from gpuwarden.safefiles import printable

    ids = list(job_ids(args.ids))
    done: list[int] = []
    refused = 0
    with require() as client:
        for job in dict.fromkeys(ids):
            try:
                client.call("requeue", job=job)
            except UserError as err:
                print(f"gpuwarden requeue: {printable(str(err))}", file=sys.stderr)
                refused += 1
                continue
            done.append(job)
    if done:
        print(f"requeued: {', '.join(str(i) for i in done)}")
    return 0 if not refused else (1 if done else 2)
