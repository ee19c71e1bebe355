"""`gpuwarden limits`: the limits the queue service holds you to, the rule that sets
each (`[service.limits]` or the machine-wide key) and how much of it you use now."""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    import argparse
    from typing import Any

    from gpuwarden.cli import Commands


def register(commands: Commands, name: str) -> None:
    from gpuwarden.cli import subcommand

    parser = subcommand(commands, name)
    parser.add_argument("--json", action="store_true", help="print JSON")


def run(args: argparse.Namespace) -> int:
    import json

    from gpuwarden.cli import service_client

    with service_client() as client:
        answer = client.call("limits")
    shown = {k: answer[k] for k in ("user", "admin", "limits")}
    print(json.dumps(shown, indent=2) if args.json else text(shown))
    return 0


def text(answer: dict[str, Any]) -> str:
    from gpuwarden.base.table import render
    from gpuwarden.base.units import format_span

    if answer["admin"]:
        return f"{answer['user']}: an admin; no limit binds you"
    if not answer["limits"]:
        return f"{answer['user']}: no limits on this machine"

    def amount(kind: str, value: Any) -> str:
        if value is None:
            return "-"
        if kind in ("max_time", "max_interactive_time"):
            return format_span(value)
        return f"{value:.1f}" if kind == "gpu_hours_per_week" else f"{value:g}"

    rows = [
        [
            row["limit"],
            amount(row["limit"], row["value"]),
            amount(row["limit"], row["used"]),
            row["rule"],
        ]
        for row in answer["limits"]
    ]
    return render(["LIMIT", "VALUE", "YOU USE", "RULE"], rows)
