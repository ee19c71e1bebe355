"""`gpuwarden share`: each user's decayed GPU usage, share and fair-share factor (as sshare),
and each account's where accounts have shares (fair share's account level)."""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    import argparse

    from gpuwarden.cli import Commands


def register(commands: Commands, name: str) -> None:
    from gpuwarden.cli import subcommand

    parser = subcommand(commands, name)
    parser.add_argument("--json", action="store_true", help="print JSON")
    parser.add_argument(
        "--accounts",
        action="store_true",
        help="only the accounts' usage, shares and factors (fair share's account level)",
    )


def run(args: argparse.Namespace) -> int:
    import json

    from gpuwarden.cli import service_client
    from gpuwarden.cli.jobtables import share_table

    with service_client() as client:
        answer = client.call("share")
    users, accounts = answer["users"], answer.get("accounts") or []
    if args.json:
        print(json.dumps(accounts if args.accounts else users, indent=2))
    elif args.accounts:
        print(share_table(accounts, "account") if accounts else "no account has a share")
    else:
        tables = [share_table(accounts, "account")] if accounts else []
        print("\n\n".join([*tables, share_table(users)]))
    return 0
