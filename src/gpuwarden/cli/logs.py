"""`gpuwarden logs ID [-f]`: a queued job's output (only its owner or an admin may read
it); `-f` follows it until the job ends. A job that could not start (a missing
command, an output it may not write) says why on stderr, exit 1. `--slurm`: a Slurm
job's."""

from __future__ import annotations

from gpuwarden.base.errors import UserError

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


def local(args: argparse.Namespace) -> int:
    from gpuwarden.cli import service_client
    from gpuwarden.cli.jobtables import job_ids
    from gpuwarden.jobs import output

    (job,) = job_ids([args.id])
    with service_client() as client:
        reply = client.call("logs", job=job)
        if reply.get("attached"):
            raise UserError(f"job {job} ran attached to a terminal: its output went there")

        def ended() -> bool:
            state = client.call("logs", job=job)["state"]
            return state not in ("PENDING", "STARTING", "RUNNING")

        try:
            code = output.show(reply["output"], reply["uid"], ended, args.follow, f"job {job}")
        except UserError:  # no output file: a job that never started says why below
            if not client.call("logs", job=job).get("error"):
                raise
            code = 1
        error = client.call("logs", job=job).get("error")
    if error:  # it never started: its output is empty, the reason is here
        import sys

        print(f"gpuwarden logs: job {job} did not start: {error}", file=sys.stderr)
        return 1
    return code


def run(args: argparse.Namespace) -> int:
    if not args.slurm:
        return local(args)
    from gpuwarden.slurm import logs

    return logs.show(args.id, follow=args.follow)
