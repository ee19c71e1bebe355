"""`gpuwarden submit [-g N] [filters] [--time T] [--after ID] -- CMD`: a batch job for
this machine's queue service (docs/service.md), which runs it as you when its GPUs are
free, with its output in `gpuwarden-ID.out`; with `--slurm`, the same request as a
Slurm batch job (docs/slurm.md), its request translated by `cli.slurmjobs`.
"""

from __future__ import annotations

import os
import sys

from gpuwarden.base.errors import UserError
from gpuwarden.cli.slurmjobs import command_of, spec_of

TYPE_CHECKING = False
if TYPE_CHECKING:
    import argparse
    from typing import Optional

    from gpuwarden.cli import Commands


def register(commands: Commands, name: str) -> None:
    from gpuwarden.cli import filters, subcommand

    parser = subcommand(commands, name)
    parser.usage = (
        "gpuwarden submit [-g N] [filters] [--time T] [--after ID] [--output FILE] "
        "[--slurm] -- CMD ARGS..."
    )
    pick = parser.add_argument_group("which GPUs")
    pick.add_argument(
        "-g", "--count", metavar="N", help="how many GPUs (per node with --slurm; 0: none)"
    )
    filters.add_filters(pick, slurm=True)
    job = parser.add_argument_group("the job")
    filters.add_time_option(job)
    filters.add_account_option(job)
    job.add_argument("--after", metavar="ID", help="start only after these jobs succeed (1,2)")
    job.add_argument("--hold", action="store_true", help="queue it held (`gpuwarden unhold`)")
    job.add_argument(
        "--notify",
        metavar="EVENTS",
        help="post begin,end,fail,requeue,timeout (or all) to your submit.webhook",
    )
    job.add_argument(
        "--begin",
        metavar="TIME",
        help="not before TIME, as sbatch's: now+1hour, 16:00, 2026-12-24T09:00",
    )
    job.add_argument(
        "--array",
        metavar="SPEC",
        help="a job array as sbatch's: 0-99, 1,3,7, 0-15:4; %%N runs at most N at once",
    )
    job.add_argument(
        "--param",
        metavar="NAME=V1,V2",
        action="append",
        help="one task per combination of the values (repeat it), each in GPUWARDEN_PARAM_NAME",
    )
    job.add_argument("--nice", metavar="N", help="lower your own priority (0..19)")
    job.add_argument(
        "--max-retries",
        metavar="N",
        help="run it again, up to N times, when it fails (exit status not 0), after a pause",
    )
    job.add_argument(
        "--preemptible",
        action="store_true",
        help="run on GPUs nobody else can use now, beyond your limits; give them back "
        "(its --signal or SIGTERM, SIGKILL after service.preempt_grace) when needed",
    )
    job.add_argument(
        "--preempt",
        choices=("requeue", "cancel"),
        help="with --preemptible: queue it again under its id (requeue, the default) or end it",
    )
    job.add_argument(
        "--output",
        metavar="FILE",
        help="its output (default gpuwarden-ID.out in this directory; slurm-%%j.out with --slurm)",
    )
    job.add_argument(
        "--ddp",
        action="store_true",
        help="start CMD (a script) with torchrun, one rank per GPU (through srun with --slurm)",
    )
    job.add_argument(
        "--dry-run",
        action="store_true",
        help="print the request (the batch script with --slurm) and submit nothing",
    )
    slurm = filters.add_slurm_options(parser, "hand it to Slurm as a batch job (sbatch)")
    slurm.add_argument("--name", metavar="NAME", help="with --slurm: the job's name")
    parser.add_argument("cmd", nargs="...", help="the command, after --")  # "...": REMAINDER


def submit_local(args: argparse.Namespace) -> int:
    """The job to this machine's queue service; prints its id."""
    from gpuwarden import config as cfg
    from gpuwarden.base.units import is_digits, parse_time_limit
    from gpuwarden.cli import filters
    from gpuwarden.placement.request import Request
    from gpuwarden.queueclient.client import job_fields, require

    for name in ("nodes", "constraint", "partition", "name"):
        if getattr(args, name, None) is not None:
            raise UserError(f"--{name} is a Slurm option: add --slurm")
    conf = cfg.load(filters.settings(args))
    request = Request.from_config(conf, mem=filters.mem_of(args))
    cmd = command_of(args)
    if args.ddp:
        from gpuwarden.jobs.launch import ddp_argv

        cmd = ddp_argv(cmd, request.gpu_count)
    else:  # a container's command line is made when the service has chosen its GPUs
        from gpuwarden.containers.command import through_service

        cmd = through_service(cmd, os.environ.get("GPUWARDEN_DEV_DIR"))
    nice = 0
    if args.nice is not None:
        if not is_digits(args.nice.lstrip("-")) or not -20 <= int(args.nice) <= 19:
            raise UserError(f"invalid --nice {args.nice!r}: a whole number from -20 to 19")
        nice = int(args.nice)
    fields = job_fields(
        request,
        cmd,
        time_limit=None if args.time is None else parse_time_limit(args.time),
        after=after_ids(args.after),
        hold=args.hold,
        nice=nice,
        output=args.output,
        warning=filters.warning_of(args),
        account=conf.get("submit.account"),
    )
    fields.update(yielding_fields(args))
    if args.begin is not None:
        import time

        from gpuwarden.planning.begintime import parse

        fields["begin"] = parse(args.begin, time.time())  # a past time: now, as sbatch
    if args.notify is not None:
        from gpuwarden.service.jobnotify import checked_url, events_of

        fields["notify"] = list(events_of(args.notify))
        url = conf.get("submit.webhook")
        if fields["notify"] and not url:
            raise UserError(
                "--notify posts to your own webhook: set `webhook` in the [submit] table of "
                "your gpuwarden config (or GPUWARDEN_SUBMIT_WEBHOOK)"
            )
        if url:
            fields["notify_url"] = checked_url(str(url))
    tasks = 0
    if args.array is not None or args.param:
        tasks = _array_fields(args, fields)
    if args.dry_run:
        import json

        shown = {k: v for k, v in fields.items() if k != "env"}
        print(json.dumps(shown, indent=2))
        return 0
    writable_output(args.output)
    with require(conf.service_socket()) as client:
        job = client.call("submit", **fields)["job"]
    print(job)
    if tasks:
        print(
            f"gpuwarden submit: array {job} of {tasks} tasks queued (`gpuwarden queue`, "
            f"`gpuwarden cancel {job}` for all of them, {job}_N for one)",
            file=sys.stderr,
        )
        return 0
    print(
        f"gpuwarden submit: job {job} queued (`gpuwarden queue`, `gpuwarden logs {job}`)",
        file=sys.stderr,
    )
    return 0


def yielding_fields(args: argparse.Namespace) -> dict[str, object]:
    """The request's `max_retries`, `preemptible` and `preempt` (docs/preemption.md)."""
    from gpuwarden.base.units import is_digits

    fields: dict[str, object] = {}
    if args.max_retries is not None:
        if not is_digits(args.max_retries) or int(args.max_retries) > 100:
            raise UserError(f"invalid --max-retries {args.max_retries!r}: a number from 0 to 100")
        fields["max_retries"] = int(args.max_retries)
    if args.preempt is not None and not args.preemptible:
        raise UserError("--preempt says what preemption does: add --preemptible")
    if args.preemptible:
        fields["preemptible"] = True
        fields["preempt"] = args.preempt or "requeue"
    return fields


def after_ids(after: Optional[str]) -> tuple[int, ...]:
    if not after:
        return ()
    from gpuwarden.cli.jobtables import job_ids

    return tuple(job_ids([after]))


def _array_fields(args: argparse.Namespace, fields: dict[str, object]) -> int:
    """The request's `array` and `params`, checked here first so that a malformed spec
    is one line before anything is sent; how many tasks it makes."""
    from gpuwarden.planning import arrayspec

    params = arrayspec.sweep(args.param or ())
    if params:
        if args.array is not None:
            arrayspec.throttle_only(args.array)
        count = arrayspec.size(params)
        if count > arrayspec.MAX_TASKS:
            raise UserError(
                f"--param makes {count} combinations; the most an array may have is "
                f"{arrayspec.MAX_TASKS}"
            )
        fields["params"] = list(args.param)
    else:
        count = len(arrayspec.parse(args.array).tasks)
    if args.array is not None:
        fields["array"] = args.array
    return count


def writable_output(output: str | None) -> None:
    """Refuse now, in one line, an output the job could not write: the service opens
    it as the submitter when the job starts, and a job that cannot fails with an empty
    log. We are the submitter, so the kernel's answer to us is the job's."""
    import os

    where = os.path.abspath(output) if output is not None else os.getcwd()
    if output is not None and os.path.isdir(where):
        raise UserError(f"--output {output} is a directory: name a file in it")
    if output is not None and os.path.exists(where):
        ok, what = os.access(where, os.W_OK), where
    else:
        what = os.path.dirname(where) if output is not None else where
        ok = os.access(what, os.W_OK | os.X_OK)
    if not ok:
        default = (
            "" if output is not None else " (the default output, gpuwarden-ID.out, goes there)"
        )
        raise UserError(
            f"you cannot write {what}{default}: the job's output would be lost; "
            "choose --output in a directory of yours"
        )


def run(args: argparse.Namespace) -> int:
    if args.output is not None and not args.output.strip():
        raise UserError("--output is empty: name a file, or leave it out for the default")
    if not args.slurm:
        return submit_local(args)
    for name in ("after", "hold", "nice", "param", "notify", "max_retries", "preemptible"):
        if getattr(args, name, None) not in (None, False):
            raise UserError(f"--{name} is for this machine's queue, not with --slurm")
    if args.array is not None:
        from gpuwarden.planning import arrayspec

        arrayspec.parse(args.array)  # Slurm's syntax: refused here in one line, as sbatch would
    if args.begin is not None:
        import time

        from gpuwarden.planning.begintime import parse

        parse(args.begin, time.time())  # likewise
    from gpuwarden.slurm import batch, tools

    spec = spec_of(args, args.mem)
    text = batch.script(spec)
    if args.dry_run:
        sys.stdout.write(text)
        return 0
    job = tools.submit(text)
    print(job)
    print(
        f"gpuwarden submit: Slurm job {job} submitted "
        f"(`gpuwarden queue --slurm`, `gpuwarden logs --slurm {job}`)",
        file=sys.stderr,
    )
    return 0
