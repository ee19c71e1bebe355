"""`gpuwarden submit [-g N] [filters] [--time T] [--after ID] -- CMD`: a batch job for
this machine's queue service (docs/service.md), which runs it as you when its GPUs are
free, with its output in `gpuwarden-ID.out`; with `--slurm`, the same request as a
Slurm batch job (docs/slurm.md), its request translated by `cli.slurmjobs`.
"""

from __future__ import annotations

import sys

from gpuwarden.cli.slurmjobs import NO_SLURM_EQUIVALENT, command_of, spec_of
from gpuwarden.errors import UserError

TYPE_CHECKING = False
if TYPE_CHECKING:
    import argparse

    from gpuwarden.cli import Commands

    Parser = argparse.ArgumentParser


def add_slurm_options(parser: Parser) -> None:
    """What `submit --slurm` and `run --slurm` share beyond -g/--model/--ddp."""
    parser.add_argument("--slurm", action="store_true", help="hand the job to Slurm")
    parser.add_argument("--nodes", metavar="K", help="with --slurm: this many nodes")
    parser.add_argument(
        "--time", metavar="T", help="with --slurm: time limit (90, 1:30:00, 2-00, 30m, 4h)"
    )
    parser.add_argument("--constraint", metavar="FEATURES", help="with --slurm: node features")
    parser.add_argument("--partition", metavar="NAME", help="with --slurm: the partition")


def register(commands: Commands, name: str) -> None:
    from gpuwarden.cli import subcommand

    parser = subcommand(commands, name)
    parser.usage = (
        "gpuwarden submit [--slurm] [-g N] [filters] [--time T] [--after ID] [--ddp] "
        "[--dry-run] -- CMD ARGS..."
    )
    parser.add_argument("-g", "--count", metavar="N", help="GPUs per node (default 1; 0: none)")
    parser.add_argument("--model", metavar="NAME", help="a GPU model; with --slurm a gres type")
    parser.add_argument(
        "--mem",
        metavar="SIZE",
        help="a shared GPU lease declaring this much GPU memory; with --slurm host memory",
    )
    for name in NO_SLURM_EQUIVALENT:
        parser.add_argument("--" + name.replace("_", "-"), metavar="X", help="(not with --slurm)")
    add_slurm_options(parser)
    local = parser.add_argument_group("this machine's queue (docs/service.md)")
    local.add_argument("--after", metavar="ID", help="start only after these jobs succeed (1,2)")
    local.add_argument("--hold", action="store_true", help="queue it held (`gpuwarden unhold`)")
    local.add_argument("--nice", metavar="N", help="lower your own priority (0..19)")
    parser.add_argument(
        "--ddp", action="store_true", help="one task per GPU through srun (init_distributed)"
    )
    parser.add_argument("--output", metavar="FILE", help="the job's output file (slurm-%%j.out)")
    parser.add_argument("--name", metavar="NAME", help="the job's name")
    parser.add_argument("--dry-run", action="store_true", help="print the batch script only")
    parser.add_argument("cmd", nargs="...", help="the command, after --")  # "...": REMAINDER


def submit_local(args: argparse.Namespace) -> int:
    """The job to this machine's queue service; prints its id."""
    from gpuwarden import config as cfg
    from gpuwarden.cli import filters
    from gpuwarden.cli.jobtables import job_ids
    from gpuwarden.selection import Request
    from gpuwarden.service.client import job_fields, require
    from gpuwarden.units import parse_duration

    for name in ("nodes", "constraint", "partition", "name"):
        if getattr(args, name, None) is not None:
            raise UserError(f"--{name} is a Slurm option: add --slurm")
    conf = cfg.load(filters.settings(args))
    request = Request.from_config(conf, mem=filters.mem_of(args))
    cmd = command_of(args)
    if args.ddp:
        from gpuwarden.launch import ddp_argv

        cmd = ddp_argv(cmd, request.gpu_count)
    nice = 0
    if args.nice is not None:
        if not args.nice.lstrip("-").isdigit() or not -20 <= int(args.nice) <= 19:
            raise UserError(f"invalid --nice {args.nice!r}: a whole number from -20 to 19")
        nice = int(args.nice)
    fields = job_fields(
        request,
        cmd,
        time_limit=None if args.time is None else parse_duration(args.time),
        after=tuple(job_ids([args.after])) if args.after else (),
        hold=args.hold,
        nice=nice,
        output=args.output,
    )
    if args.dry_run:
        import json

        shown = {k: v for k, v in fields.items() if k != "env"}
        print(json.dumps(shown, indent=2))
        return 0
    with require(conf.get("service.socket")) as client:
        job = client.call("submit", **fields)["job"]
    print(job)
    print(
        f"gpuwarden submit: job {job} queued (`gpuwarden queue`, `gpuwarden logs {job}`)",
        file=sys.stderr,
    )
    return 0


def run(args: argparse.Namespace) -> int:
    if not args.slurm:
        return submit_local(args)
    for name in ("after", "hold", "nice"):
        if getattr(args, name, None) not in (None, False):
            raise UserError(f"--{name} is for this machine's queue, not with --slurm")
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
