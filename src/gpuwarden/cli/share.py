"""`gpuwarden share`: each user's decayed GPU usage, share and fair-share factor (as sshare)."""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    import argparse

    from gpuwarden.cli import Commands


def register(commands: Commands, name: str) -> None:
    from gpuwarden.cli import subcommand

    parser = subcommand(commands, name)
    parser.add_argument("--json", action="store_true", help="print JSON")


def run(args: argparse.Namespace) -> int:
    import json

    from gpuwarden.cli.jobtables import share_table
    from gpuwarden.queueclient.client import require

    with require() as client:
        users = client.call("share")["users"]
    print(json.dumps(users, indent=2) if args.json else share_table(users))
    return 0
