"""`gpuwarden slurm conf|prolog|epilog`: an admin's help to run Slurm on this machine.

gpuwarden slurm conf              gres.conf lines and the NodeName= line, from NVML
gpuwarden slurm prolog            (slurmd's Prolog=) lease the job's GPUs
gpuwarden slurm epilog            (slurmd's Epilog=) free them
"""

from __future__ import annotations

import os
import sys

from gpuwarden.errors import UserError

TYPE_CHECKING = False
if TYPE_CHECKING:
    import argparse

    from gpuwarden.cli import Commands


def register(commands: Commands, name: str) -> None:
    from gpuwarden.cli import subcommand

    parser = subcommand(commands, name)
    parser.add_argument("action", choices=("conf", "prolog", "epilog"), help="what to do")
    parser.add_argument(
        "--section",
        choices=("all", "gres", "node"),
        default="all",
        help="conf: only gres.conf's lines, or only slurm.conf's NodeName= line",
    )
    parser.add_argument(
        "--dev-dir", metavar="DIR", default="/dev", help="conf: where nvidiaN are (/dev)"
    )
    parser.add_argument("--type", metavar="NAME", help="conf: a gres type for these GPUs")


def run(args: argparse.Namespace) -> int:
    if args.action == "conf":
        return conf(args)
    from gpuwarden import config as cfg
    from gpuwarden.slurm import prolog

    if args.action == "prolog":
        timeout = float(cfg.load({}).get("slurm.prolog_timeout"))
        print(prolog.prolog(os.environ, timeout), file=sys.stderr)
    else:
        print(prolog.epilog(os.environ), file=sys.stderr)
    return 0


def conf(args: argparse.Namespace) -> int:
    from gpuwarden.inventory import read_snapshot
    from gpuwarden.slurm import gres

    if args.type is not None:
        from gpuwarden.slurm.batch import check_word

        check_word("--type", args.type)
    snapshot = read_snapshot(processes=False, topology=True)
    if not snapshot.gpus:
        raise UserError(f"no GPUs to describe: {snapshot.error or 'NVML found none'}")
    from gpuwarden.slurm import miggres

    devices = gres.read_devices(snapshot)
    has_mig = any(g.mig_mode and g.mig_instances for g in snapshot.gpus)
    minors = miggres.read_minors() if has_mig else None
    lines = gres.gres_lines(
        snapshot, devices, dev_dir=args.dev_dir, gpu_type=args.type, mig_minors=minors
    )
    node = gres.node_line(
        snapshot.hostname,
        len(lines),
        cpus=os.cpu_count() or 1,
        memory_mib=gres.memory_mib(),
        gres=miggres.counts(lines),
    )
    where = "" if snapshot.source == "nvml" else f" ({snapshot.source})"
    if args.section in ("all", "gres"):
        print(f"# gres.conf for {snapshot.hostname}{where}, in NVML index order")
        for note in gres.notes(devices):
            print(f"# {note}")
        if has_mig:
            print(
                "# MIG devices: one MultipleFiles= line each (parent GPU and its two "
                "nvidia-caps devices), typed MODEL_PROFILE; capability minors "
                + (
                    f"from {miggres.MIG_MINORS}"
                    if minors is not None
                    else f"by the driver's numbering rule ({miggres.MIG_MINORS} unreadable here)"
                )
            )
        print("\n".join(lines))
    if args.section == "all":
        print("# slurm.conf: this node's line (`slurmd -C` prints sockets, cores, threads)")
    if args.section in ("all", "node"):
        print(node)
    return 0
