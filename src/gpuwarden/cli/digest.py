"""`gpuwarden digest`: your GPU use of the last week, told kindly (the idle jobs named),
now or every week through your own webhook or mail; `--admin` the machine's."""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    import argparse

    from gpuwarden.cli import Commands


def register(commands: Commands, name: str) -> None:
    from gpuwarden.cli import subcommand

    parser = subcommand(commands, name)
    what = parser.add_mutually_exclusive_group()
    what.add_argument(
        "--subscribe",
        action="store_true",
        help="send me one every service.digest_every (a week), to my submit.webhook",
    )
    what.add_argument("--unsubscribe", action="store_true", help="send me none any more")
    parser.add_argument(
        "--mail", action="store_true", help="with --subscribe: by mail, not the webhook"
    )
    parser.add_argument("--admin", action="store_true", help="the admins' digest (admins only)")
    parser.add_argument("--days", type=float, default=7.0, help="the period shown (7 days)")
    parser.add_argument("--json", action="store_true", help="print JSON")


def run(args: argparse.Namespace) -> int:
    import json

    from gpuwarden.base.errors import UserError
    from gpuwarden.cli import service_client
    from gpuwarden.config import load

    fields: dict[str, object] = {"action": "show", "admin": args.admin, "days": args.days}
    if args.unsubscribe:
        fields["action"] = "unsubscribe"
    elif args.subscribe:
        fields["action"] = "subscribe"
        if not args.mail:
            from gpuwarden.service.jobnotify import checked_url

            url = load().get("submit.webhook")
            if not url:
                raise UserError(
                    "the digest goes to your own webhook: set `webhook` in the [submit] table "
                    "of your gpuwarden config (or GPUWARDEN_SUBMIT_WEBHOOK), or add --mail"
                )
            fields["url"] = checked_url(str(url))
    elif args.mail:
        raise UserError("--mail goes with --subscribe")
    with service_client() as client:
        answer = client.call("digest", **fields)
    if args.json:
        said = {k: v for k, v in answer.items() if k not in ("ok", "v")}
        print(json.dumps(answer.get("digest", said), indent=2))
    elif "digest" in answer:
        print(answer["digest"]["text"], end="")
    elif answer.get("subscribed"):
        print(f"subscribed: your digest comes by {answer['by']}")
    else:
        print("unsubscribed" if answer.get("was") else "you had no subscription")
    return 0
