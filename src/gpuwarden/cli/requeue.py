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
    from gpuwarden.base.errors import UserError
    from gpuwarden.cli import service_client
    from gpuwarden.cli.jobtables import acted, job_ids

    done: list[int] = []
    refused: list[dict[str, str]] = []
    with service_client() as client:
        for job in dict.fromkeys(job_ids(args.ids)):  # the service requeues one at a time
            try:
                client.call("requeue", job=job)
            except UserError as err:
                refused.append({"error": str(err)})
                continue
            done.append(job)
    return acted("requeue", "requeued", done, refused)
