"""`gpuwarden report`: GPU-hours, jobs and waits by user, group, account or job, per day,
week or month (as sreport); `--waste`: GPU-hours held idle; `--slurm`: Slurm's
accounting (sacct) in the same columns; `--journal FILE`: a journal read directly."""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    import argparse
    from collections.abc import Sequence
    from typing import Any

    from gpuwarden.cli import Commands


def register(commands: Commands, name: str) -> None:
    from gpuwarden.cli import subcommand
    from gpuwarden.usage.report import BY, PER

    parser = subcommand(commands, name)
    parser.add_argument("--by", choices=BY, default="user", help="group the rows by (user)")
    parser.add_argument("--per", choices=PER, default="all", help="one row per period (all)")
    parser.add_argument(
        "--since", default="30d", metavar="WHEN", help="from: 30d (ago), 2026-11-01 (30d)"
    )
    parser.add_argument("--until", default="now", metavar="WHEN", help="to (now)")
    parser.add_argument(
        "--format", choices=("table", "csv", "json"), default="table", help="table, csv or json"
    )
    parser.add_argument("--waste", action="store_true", help="GPU-hours held idle instead")
    parser.add_argument("--slurm", action="store_true", help="Slurm's accounting (sacct)")
    parser.add_argument(
        "--journal", metavar="FILE", help="read this journal file (root), not the service"
    )


def when(text: str, now: float) -> float:
    """`30d`, `12h`, `2w` ago; else a date or time as `submit --begin` reads it."""
    import re

    from gpuwarden.planning.begintime import parse

    ago = re.fullmatch(r"(\d+(?:\.\d+)?)([smhdw])", text.strip().lower())
    if ago:
        unit = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}[ago.group(2)]
        return now - float(ago.group(1)) * unit
    return parse(text, now)


def run(args: argparse.Namespace) -> int:
    import time

    from gpuwarden.base.errors import UserError
    from gpuwarden.usage.report import from_dicts

    now = time.time()
    since, until = when(args.since, now), when(args.until, now)
    if until <= since:
        raise UserError(f"--until ({args.until}) is not after --since ({args.since})")
    if args.slurm:
        if args.waste:
            raise UserError("--waste needs the service's samples; Slurm's are not read")
        from gpuwarden.slurm.usage import report as slurm_report

        rows = slurm_report(since, until, args.by, args.per)
    elif args.journal:
        rows, waste = _from_journal(args, since, until, now)
        if args.waste:
            return _print_waste(waste, args)
    else:
        from gpuwarden.cli import service_client

        ask = {"since": since, "until": until, "by": args.by, "per": args.per}
        with service_client() as client:
            reply = client.call("report", waste=args.waste, **ask)
        if args.waste:
            return _print_waste(reply.get("waste") or [], args)
        rows = from_dicts(reply.get("rows") or [])
    _print(rows, args)
    return 0


def _from_journal(
    args: argparse.Namespace, since: float, until: float, now: float
) -> tuple[list[Any], list[dict[str, Any]]]:
    """The rows from a journal file, opened read-only (the service may be writing it)."""
    import os
    import sqlite3

    from gpuwarden.base.errors import UserError
    from gpuwarden.service import accounting, archive

    if not os.path.isfile(args.journal):
        raise UserError(f"--journal {args.journal}: no such file")
    try:
        db = sqlite3.connect(f"file:{os.path.abspath(args.journal)}?mode=ro", uri=True)
        try:
            state = os.path.dirname(os.path.abspath(args.journal))
            if args.waste:
                used = archive.uses(state, since, until)
                found = accounting.waste_report(db, since, until, args.by, archived=used)
                return [], [w._asdict() for w in found]
            old = archive.runs(state, since, until)
            return accounting.report(db, since, until, args.by, args.per, now, old), []
        finally:
            db.close()
    except sqlite3.Error as err:
        raise UserError(f"--journal {args.journal}: cannot read it ({err})") from None


def _print(rows: Sequence[Any], args: argparse.Namespace) -> None:
    import json

    from gpuwarden.base.table import render
    from gpuwarden.cli.jobtables import span
    from gpuwarden.files.safefiles import printable
    from gpuwarden.usage.report import as_dicts

    if args.format == "json":
        print(json.dumps(as_dicts(rows), indent=2))
        return
    if args.format == "csv":
        import csv
        import sys

        out = csv.writer(sys.stdout, lineterminator="\n")
        out.writerow(["period", args.by, "gpu_hours", "jobs", "runs", "mean_wait_s", "p90_wait_s"])
        for r in rows:
            out.writerow(
                [
                    r.period,
                    r.name,
                    f"{r.gpu_hours:.6f}",
                    r.jobs,
                    r.runs,
                    "" if r.mean_wait is None else f"{r.mean_wait:.1f}",
                    "" if r.p90_wait is None else f"{r.p90_wait:.1f}",
                ]
            )
        return
    if not rows:
        print("no GPU use in that time")
        return
    table = [
        [
            r.period,
            printable(str(r.name)),
            f"{r.gpu_hours:.2f}",
            str(r.jobs),
            str(r.runs),
            span(r.mean_wait),
            span(r.p90_wait),
        ]
        for r in rows
    ]
    table.append(["total", "", f"{sum(r.gpu_hours for r in rows):.2f}", "", "", "", ""])
    headers = ["PERIOD", args.by.upper(), "GPU-HOURS", "JOBS", "RUNS", "MEAN WAIT", "P90 WAIT"]
    if args.per == "all":
        headers, table = headers[1:], [row[1:] for row in table]
        table[-1][0] = "total"
    print(render(headers, table, right=tuple(range(len(headers) - 5, len(headers)))))


def _print_waste(rows: Sequence[dict[str, Any]], args: argparse.Namespace) -> int:
    import json

    from gpuwarden.base.table import render
    from gpuwarden.files.safefiles import printable

    if args.format == "json":
        print(json.dumps(list(rows), indent=2))
        return 0
    if args.format == "csv":
        import csv
        import sys

        out = csv.writer(sys.stdout, lineterminator="\n")
        out.writerow([args.by, "held_gpu_hours", "idle_gpu_hours", "gpus_never_used", "jobs"])
        for r in rows:
            out.writerow(
                [
                    r["name"],
                    f"{r['held_hours']:.6f}",
                    f"{r['idle_hours']:.6f}",
                    r["gpus_idle"],
                    r["jobs"],
                ]
            )
        return 0
    if not rows:
        print("no sampled GPU use in that time")
        return 0
    table = [
        [
            printable(str(r["name"])),
            f"{r['held_hours']:.2f}",
            f"{r['idle_hours']:.2f}",
            f"{100 * r['idle_hours'] / r['held_hours']:.0f}%" if r["held_hours"] else "-",
            str(r["gpus_idle"]),
            str(r["jobs"]),
        ]
        for r in rows
    ]
    headers = [args.by.upper(), "HELD GPU-H", "IDLE GPU-H", "IDLE", "GPUS NEVER USED", "JOBS"]
    print(render(headers, table, right=(1, 2, 3, 4, 5)))
    return 0
