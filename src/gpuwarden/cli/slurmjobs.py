"""The Slurm job a `run` or `submit` command line asks for (`--slurm`): shared by both.

`submit --slurm` writes it as a batch script for `sbatch`; `run --slurm` runs it
attached to the terminal through `srun`, whose exit status is the job's. The
translation itself (gres, time, nodes, constraint) is `gpuwarden.slurm.batch`'s;
here the options are checked against what Slurm can express.
"""

from __future__ import annotations

import os
import sys

from gpuwarden.base.errors import UserError
from gpuwarden.jobs.options import command_of as command_of

TYPE_CHECKING = False
if TYPE_CHECKING:
    import argparse
    from typing import Any


# Filters that choose among one machine's GPUs by what NVML shows; under Slurm the
# scheduler picks the GPUs, so they have no meaning there.
NO_SLURM_EQUIVALENT = ("gpus", "min_free", "max_util", "min_capability", "exclude", "mig")


def spec_of(args: argparse.Namespace, mem: Any = None, *, attached: bool = False) -> Any:
    from gpuwarden.jobs.options import warning_of
    from gpuwarden.slurm import batch

    for name in NO_SLURM_EQUIVALENT:
        if getattr(args, name, None) is not None:
            flag = "--" + name.replace("_", "-")
            raise UserError(
                f"{flag} chooses among this machine's GPUs; under --slurm Slurm picks them "
                "(use --model or --constraint for node features)"
            )
    types = ()
    if args.model is not None:  # the config only says which --model names are gres types
        from gpuwarden import config as cfg

        types = cfg.load({}).get("slurm.gpu_types") or ()
    return batch.spec_of(
        command_of(args),
        gpus=args.count,
        nodes=args.nodes,
        time=args.time,
        mem=mem,
        model=args.model,
        constraint=args.constraint,
        gpu_types=types,
        ddp=args.ddp,
        output=getattr(args, "output", None),
        name=getattr(args, "name", None),
        partition=args.partition,
        account=getattr(args, "account", None),
        array=getattr(args, "array", None),
        begin=getattr(args, "begin", None),
        signal=batch.slurm_signal(warning_of(args), ddp=args.ddp, attached=attached),
    )


def run_attached(args: argparse.Namespace) -> int:
    """`gpuwarden run --slurm`: the same request through `srun`, attached to this terminal;
    srun's exit status is the job's."""
    from gpuwarden.slurm import batch, tools

    if args.mem is not None:
        raise UserError(
            "run --mem declares a share of a GPU on this machine; Slurm has no such share "
            "(for host memory use `gpuwarden submit --slurm --mem`)"
        )
    for name in ("wait", "timeout", "nproc"):
        if getattr(args, name, None) not in (None, False):
            raise UserError(f"--{name} applies to this machine's GPUs, not with --slurm")
    if getattr(args, "cpu", False):
        args.count = "0"
    args.name = None
    spec = spec_of(args, attached=True)
    argv = batch.srun_argv(spec)
    if args.dry_run:
        import shlex

        print(shlex.join(argv))
        return 0
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        os.execvpe(argv[0], argv, tools.clean_env())
    except FileNotFoundError:
        raise UserError(
            "srun not found on PATH: install Slurm's client commands (Debian: slurm-client) "
            "or run where they are"
        ) from None
    return 127  # not reached
