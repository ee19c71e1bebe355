"""`gpuwarden submit [-g N] [filters] [--time T] [--after ID] -- CMD`: a batch job for
this machine's queue service (docs/service.md), which runs it as you when its GPUs are
free, with its output in `gpuwarden-ID.out`; with `--slurm`, the same request as a
Slurm batch job (docs/slurm.md), its request translated by `cli.slurmjobs`.

The grammar and the reading of a command line are `queueclient.submitting`'s, shared
with the service: a plain submit usually never gets here, `queueclient.thin` hands its
command line to the service (`cli.console`); this is the full client, for everything
else and wherever the short one cannot go.
"""

from __future__ import annotations

import os
import sys

from gpuwarden.base.errors import UserError
from gpuwarden.cli.slurmjobs import spec_of
from gpuwarden.queueclient import submitting

TYPE_CHECKING = False
if TYPE_CHECKING:
    import argparse

    from gpuwarden.cli import Commands


def register(commands: Commands, name: str) -> None:
    from gpuwarden.cli import subcommand

    submitting.declare(subcommand(commands, name))


def submit_local(args: argparse.Namespace) -> int:
    """The job to this machine's queue service; prints its id."""
    from gpuwarden import config as cfg
    from gpuwarden.queueclient.client import require
    from gpuwarden.queueclient.writable import check

    conf = cfg.load(submitting.local_settings(args))
    mask = os.umask(0)
    os.umask(mask)
    place = submitting.Place(os.getcwd(), os.environ, mask, sys.executable)
    fields, tasks = submitting.fields_of(args, conf, place)
    if args.dry_run:
        import json

        shown = {k: v for k, v in fields.items() if k != "env"}
        print(json.dumps(shown, indent=2))
        return 0
    check(args.output)
    with require(conf.service_socket()) as client:
        job = client.call("submit", **fields)["job"]
    out, err = submitting.said(job, tasks)
    sys.stdout.write(out)
    sys.stderr.write(err)
    return 0


def run(args: argparse.Namespace) -> int:
    submitting.first_checks(args)
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
