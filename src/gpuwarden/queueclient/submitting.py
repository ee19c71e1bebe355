"""`gpuwarden submit`'s grammar and what a command line makes of it: one definition
for the full client (`cli.submit`) and the service, which reads the command line
the short client (`queueclient.thin`) sends it (`service.argvsubmit`).

Nothing here reads this process's working directory, environment, umask or
interpreter: each is given (`Place`), so the service reads a command line exactly
as the client that typed it would have.
"""

from __future__ import annotations

from gpuwarden.base.errors import UserError
from gpuwarden.jobs import options

TYPE_CHECKING = False
if TYPE_CHECKING:
    import argparse
    from collections.abc import Mapping
    from typing import Any

    from gpuwarden.config import Config


class Place:
    """Where a submit comes from: the submitting process's working directory,
    environment, umask and interpreter (what the job inherits)."""

    __slots__ = ("cwd", "env", "python", "umask")

    def __init__(self, cwd: str, env: Mapping[str, str], umask: int, python: str) -> None:
        self.cwd, self.env, self.umask, self.python = cwd, env, umask, python


USAGE = (
    "gpuwarden submit [-g N] [filters] [--time T] [--after ID] [--output FILE] "
    "[--slurm] -- CMD ARGS..."
)


def declare(parser: argparse.ArgumentParser) -> None:
    """`submit`'s options and its command, into `parser`."""
    parser.usage = USAGE
    pick = parser.add_argument_group("which GPUs")
    pick.add_argument(
        "-g", "--count", metavar="N", help="how many GPUs (per node with --slurm; 0: none)"
    )
    options.add_filters(pick, slurm=True)
    job = parser.add_argument_group("the job")
    options.add_time_option(job)
    options.add_account_option(job)
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
    slurm = options.add_slurm_options(parser, "hand it to Slurm as a batch job (sbatch)")
    slurm.add_argument("--name", metavar="NAME", help="with --slurm: the job's name")
    parser.add_argument("cmd", nargs="...", help="the command, after --")  # "...": REMAINDER


def first_checks(args: argparse.Namespace) -> None:
    """What `submit` refuses before anything else, with or without --slurm."""
    if args.output is not None and not args.output.strip():
        raise UserError("--output is empty: name a file, or leave it out for the default")


def local_settings(args: argparse.Namespace) -> dict[str, object]:
    """The command line's settings for this machine's queue (not --slurm), as
    `config.load(cli=...)` takes them; Slurm's own options refused in one line."""
    for name in ("nodes", "constraint", "partition", "name"):
        if getattr(args, name, None) is not None:
            raise UserError(f"--{name} is a Slurm option: add --slurm")
    return options.settings(args)


def fields_of(args: argparse.Namespace, conf: Config, place: Place) -> tuple[dict[str, Any], int]:
    """(the submit request's fields, how many array tasks it makes: 0 for one job)."""
    from gpuwarden.base.units import is_digits, parse_time_limit
    from gpuwarden.placement.request import Request
    from gpuwarden.queueclient.client import job_fields

    request = Request.from_config(conf, mem=options.mem_of(args))
    cmd = options.command_of(args)
    if args.ddp:  # reads the script and finds torch here: the full client's alone
        from gpuwarden.jobs.launch import ddp_argv

        cmd = ddp_argv(cmd, request.gpu_count)
    else:  # a container's command line is made when the service has chosen its GPUs
        from gpuwarden.containers.command import through_service

        cmd = through_service(cmd, place.env.get("GPUWARDEN_DEV_DIR"), python=place.python)
    nice = 0
    if args.nice is not None:
        if not is_digits(args.nice.lstrip("-")) or not -20 <= int(args.nice) <= 19:
            raise UserError(f"invalid --nice {args.nice!r}: a whole number from -20 to 19")
        nice = int(args.nice)
    fields = job_fields(
        request,
        cmd,
        time_limit=None if args.time is None else parse_time_limit(args.time),
        after=tuple(options.job_ids([args.after])) if args.after else (),
        hold=args.hold,
        nice=nice,
        output=args.output,
        warning=options.warning_of(args),
        account=conf.get("submit.account"),
        place=(place.cwd, place.env, place.umask),
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
    return fields, tasks


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


def said(job: object, tasks: int) -> tuple[str, str]:
    """(stdout, stderr) of a queued submit: its id, and one line on where it went."""
    if tasks:
        return f"{job}\n", (
            f"gpuwarden submit: array {job} of {tasks} tasks queued (`gpuwarden queue`, "
            f"`gpuwarden cancel {job}` for all of them, {job}_N for one)\n"
        )
    return f"{job}\n", (
        f"gpuwarden submit: job {job} queued (`gpuwarden queue`, `gpuwarden logs {job}`)\n"
    )
