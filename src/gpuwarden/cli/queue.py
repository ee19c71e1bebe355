"""`gpuwarden queue`: this machine's queue (running jobs, then waiting ones in priority
order with why they wait, as squeue shows them); `--slurm`: Slurm's, in the same words
(pending (Resources), running, ...)."""

from __future__ import annotations

import sys

from gpuwarden.queueclient.thinqueue import PAGE  # jobs shown without --all

TYPE_CHECKING = False
if TYPE_CHECKING:
    import argparse
    from typing import Any, Optional

    from gpuwarden.cli import Commands


def register(commands: Commands, name: str) -> None:
    from gpuwarden.cli import subcommand

    parser = subcommand(commands, name)
    parser.add_argument("--slurm", action="store_true", help="Slurm's queue")
    parser.add_argument("--me", action="store_true", help="only my jobs")
    parser.add_argument("--user", metavar="NAME", help="only this user's jobs (squeue -u)")
    parser.add_argument("--json", action="store_true", help="print the jobs as JSON")
    parser.add_argument(
        "--start",
        action="store_true",
        help="waiting jobs with their expected start, as squeue --start (N/A: nobody can say)",
    )
    parser.add_argument("--all", action="store_true", help=f"every job, not only the first {PAGE}")
    parser.add_argument(
        "--hosts",
        metavar="FILE|H1,H2",
        help="the queues of every listed host in one table, over your ssh (docs/hosts.md)",
    )


def local(args: argparse.Namespace) -> int:
    from gpuwarden.cli import service_client
    from gpuwarden.files.paths import user_name

    who = user_name() if args.me else args.user
    filters = {} if who is None else {"user": who}
    with service_client() as client:
        if not args.json and not args.start and table(client, None if args.all else PAGE, filters):
            return 0
        jobs, reply = client.listing(
            "queue", None if args.all else PAGE, arrays=not args.json, **filters
        )
    total = reply.get("total")
    left = total - len(jobs) if isinstance(total, int) else 0
    if left > 0:
        print(
            f"gpuwarden queue: {len(jobs)} of {total} jobs shown; --all shows every one",
            file=sys.stderr,
        )
    if args.start and not args.json:
        print(start_table(jobs))
    elif args.json:
        import json

        if args.start:
            jobs = [j for j in jobs if j.get("state") == "PENDING"]
        json.dump(jobs, sys.stdout, indent=2)
        print()
    else:
        headers(reply)
        from gpuwarden.cli.jobtables import queue_table

        print(queue_table(jobs))
    return 0


def table(client: Any, rows: Optional[int], filters: dict[str, str]) -> bool:
    """The queue's table as the service writes it (service.queuetext): its lines
    written as each page comes, none decoded into a record; False from a service
    that answers rows instead (an older release), to draw them here."""
    from gpuwarden.queueclient.protocol import MAX_PAGE_ROWS

    offset = 0
    while True:
        want = MAX_PAGE_ROWS if rows is None else min(MAX_PAGE_ROWS, rows - offset)
        reply = client.call("queue", offset=offset, limit=want, arrays=True, table=True, **filters)
        lines = reply.get("lines")
        if not isinstance(lines, list):
            return False
        if offset == 0:
            total = reply.get("total") or 0
            if rows is not None and total > rows:
                print(
                    f"gpuwarden queue: {rows} of {total} jobs shown; --all shows every one",
                    file=sys.stderr,
                )
            headers(reply)
            print(reply.get("header") if total else "no jobs queued or running")
        if lines:
            sys.stdout.write("\n".join(lines) + "\n")
        more = reply.get("next")
        if not isinstance(more, int) or more <= offset or (rows is not None and more >= rows):
            return True
        offset = more


def headers(reply: dict[str, Any]) -> None:
    """The lines above the table: GPU use outside the queue, the next bookings."""
    if not (reply.get("unleased") or reply.get("bookings") or reply.get("bookings_total")):
        return
    from gpuwarden.cli.jobtables import booking_lines, unleased_lines

    for line in unleased_lines(reply.get("unleased") or ()):
        print(line)
    shown = reply.get("bookings") or ()
    for line in booking_lines(shown):
        print(line)
    more = int(reply.get("bookings_total") or 0) - len(shown)
    if more > 0:
        print(f"and {more} more bookings (`gpuwarden book --list`)")


def start_table(jobs: list[dict[str, object]]) -> str:
    """The waiting jobs in priority order, each with when it should start (local time)
    and why it waits, as `squeue --start`; N/A where that depends on a job without
    `--time`, a hold, a dependency or a limit."""
    import time as clock

    from gpuwarden.base.table import render
    from gpuwarden.cli.jobtables import job_label
    from gpuwarden.files.safefiles import printable

    waiting = sorted(
        (j for j in jobs if j.get("state") == "PENDING"),
        key=lambda j: (-float(j.get("priority") or 0.0), float(j.get("submitted") or 0.0)),  # type: ignore[arg-type]
    )
    rows = []
    for job in waiting:
        at = job.get("estimated_start")
        when = "N/A"
        if isinstance(at, (int, float)):
            when = clock.strftime("%Y-%m-%dT%H:%M:%S", clock.localtime(at))
        rows.append(
            [
                job_label(job),
                printable(str(job.get("user"))),
                when,
                printable(str(job.get("reason") or "-")),
            ]
        )
    return render(["JOBID", "USER", "START_TIME", "REASON"], rows)


def on_hosts(args: argparse.Namespace) -> int:
    """Each host's own `queue --json`, in one table with a HOST column; exit 1 when a
    host's queue could not be read (its line says why)."""
    from gpuwarden.hosts import merge, remote

    if args.slurm:
        from gpuwarden.base.errors import UserError

        raise UserError("--hosts reads each host's queue service; Slurm's queue is one already")
    hosts = remote.parse_hosts(args.hosts)
    argv = ["queue", "--json", *(["--me"] if args.me else []), *(["--all"] if args.all else [])]
    if args.user is not None:
        argv.append(f"--user={args.user}")
    merged = merge.merge_jobs(remote.ask_json(hosts, argv))
    if args.json:
        import json

        json.dump(merged, sys.stdout, indent=2)
        print()
    else:
        from gpuwarden.cli.jobtables import queue_table

        print(queue_table(merged["jobs"]))
        for line in merge.notes(merged):
            print(line)
    return 0 if all(h["ok"] for h in merged["hosts"]) else 1


def run(args: argparse.Namespace) -> int:
    if args.hosts is not None:
        return on_hosts(args)
    if not args.slurm:
        return local(args)
    from gpuwarden.slurm import tools

    user = args.user
    if args.me:
        import os

        from gpuwarden.files.paths import user_name

        user = user_name(os.geteuid())
    jobs = tools.queue(user=user)
    from gpuwarden.slurm.annotate import details

    notes = details(jobs)
    if args.json:
        import json

        fields = ("id", "user", "state", "reason", "elapsed", "limit", "nodes", "gres", "name")
        json.dump(
            [{**{f: getattr(j, f) for f in fields}, "detail": notes.get(j.id, "")} for j in jobs],
            sys.stdout,
            indent=2,
        )
        print()
        return 0
    if not jobs:
        print("no Slurm jobs")
        return 0
    from gpuwarden.base.table import render

    rows = [
        [
            j.id,
            j.user,
            j.state + (f" ({notes.get(j.id) or j.reason})" if notes.get(j.id) or j.reason else ""),
            j.elapsed,
            j.limit,
            j.gres or "-",
            j.nodelist or "-",
            j.name,
        ]
        for j in jobs
    ]
    print(render(["JOB", "USER", "STATE", "TIME", "LIMIT", "GRES", "NODES", "NAME"], rows))
    return 0
