"""`gpuwarden select -g N [filters]`: print the IDs of GPUs that fit, without reserving them.

For scripts in the style of `CUDA_VISIBLE_DEVICES=$(nvisel -n 1) python train.py`.
Nothing is held, so another job may take the same GPUs a moment later; stderr
says so, and `gpuwarden run` / `gpuwarden reserve` are the commands that hold.
"""

from __future__ import annotations

import sys

from gpuwarden.cli import filters

TYPE_CHECKING = False  # argparse is read only by type checkers here
if TYPE_CHECKING:
    import argparse

    from gpuwarden.cli import Commands


def register(commands: Commands, name: str) -> None:
    from gpuwarden.cli import subcommand

    parser = subcommand(commands, name)
    parser.add_argument("-g", "-n", "--count", metavar="N", help="how many GPUs (default 1)")
    filters.add_filters(parser)
    parser.add_argument("--uuid", action="store_true", help="print UUIDs instead of indices")
    parser.add_argument(
        "--explain", action="store_true", help="say on stderr why each GPU was or was not chosen"
    )
    parser.add_argument(
        "-q", "--quiet", action="store_true", help="no reminder that nothing is reserved"
    )


def run(args: argparse.Namespace) -> int:
    from gpuwarden import config
    from gpuwarden.drain import list_drains
    from gpuwarden.errors import UserError
    from gpuwarden.inventory import read_snapshot
    from gpuwarden.jobs import allowed
    from gpuwarden.launch import export_value
    from gpuwarden.leases import EXIT_BUSY, list_leases
    from gpuwarden.locations import lease_location, state_location
    from gpuwarden.selection import Request, choose
    from gpuwarden.units import format_size
    from gpuwarden.xidlog import judged

    cfg = config.load(filters.settings(args))
    mem = filters.mem_of(args)
    snapshot = read_snapshot(topology=True)
    scope = allowed(snapshot)
    request = Request.from_config(cfg, mem=mem)
    choice = choose(
        snapshot,
        request,
        list_leases(lease_location(cfg)),
        list_drains(state_location(cfg)),
        scope,
        judged(snapshot.gpus),
    )
    if args.explain:
        from gpuwarden.mig import devices

        for gpu in devices(snapshot):
            if any(g.uuid == gpu.uuid for g in choice.gpus):
                why = f"chosen ({format_size(gpu.memory_free)} free)"
            else:
                why = choice.passed_over.get(gpu.uuid, "")
            print(f"GPU {gpu.index} {gpu.uuid}: {why}", file=sys.stderr)
    if choice.error:
        raise UserError(choice.error, exit_code=None if choice.never_fits else EXIT_BUSY)
    print(export_value(choice.gpus, bool(args.uuid or cfg.get("run.id_format") == "uuid")))
    if not args.quiet:
        print(
            "gpuwarden select: not reserved; another job may take these GPUs "
            "(`gpuwarden run` or `gpuwarden reserve` hold them)",
            file=sys.stderr,
        )
    return 0
