"""`gpuwarden hold ID...` / `gpuwarden unhold ID...`: keep waiting jobs from starting, or let them.

Only the job's owner or an admin may hold or unhold it (the service checks, from
the kernel's word on who is asking). A held job keeps its place: its priority
still ages.
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
    from gpuwarden.cli import service_client
    from gpuwarden.cli.jobtables import acted, job_names

    op = "hold" if args.command == "hold" else "release"
    with service_client() as client:
        reply = client.call(op, jobs=job_names(args.ids))
    done = reply.get("names") or reply["jobs"]
    return acted(
        args.command, "held" if op == "hold" else "released", done, reply.get("refused") or ()
    )
