"""`gpuwarden select -g N [filters]`: print the IDs of GPUs that fit, without reserving them.

For scripts in the style of `CUDA_VISIBLE_DEVICES=$(nvisel -n 1) python train.py`.
Nothing is held, so another job may take the same GPUs a moment later; stderr
says so, and `gpuwarden run` / `gpuwarden reserve` are the commands that hold.
"""

from __future__ import annotations

import sys

from gpuwarden.jobs import options as filters

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
    parser.add_argument(
        "--hosts",
        metavar="FILE|H1,H2",
        help="on which listed hosts the GPUs are free (`HOST IDS` each), over your ssh",
    )


# The options a host's own `select` is given again, as `--flag=value` (a value may start
# with a dash).
FORWARDED: tuple[str, ...] = ("count", "gpus", "min_free", "max_util", "min_capability")
FORWARDED += ("model", "exclude", "mig", "mem")


def on_hosts(args: argparse.Namespace) -> int:
    """Each host's own `select` with the same options (checked here first, so a slip is
    one line, not one per host): `HOST IDS` for every host where they fit now."""
    from gpuwarden import config
    from gpuwarden.base.errors import UserError
    from gpuwarden.hosts import merge, remote
    from gpuwarden.leases import EXIT_BUSY

    config.load(filters.settings(args))
    filters.mem_of(args)
    hosts = remote.parse_hosts(args.hosts)
    argv = ["select", "--quiet", *(["--uuid"] if args.uuid else [])]
    for dest in FORWARDED:
        value = getattr(args, dest)
        if value is not None:
            argv.append(f"--{dest.replace('_', '-')}={value}")
    replies = remote.run_everywhere(hosts, argv)
    fits, notes = merge.where_free([(r.host, r.stdout if r.ok else "", r.error) for r in replies])
    for line in notes:
        print(line, file=sys.stderr)
    if not fits:
        raise UserError(f"no host has GPUs that fit now ({len(hosts)} asked)", exit_code=EXIT_BUSY)
    for host, ids in fits:
        print(f"{host} {ids}")
    if not args.quiet:
        print(
            "gpuwarden select: not reserved; another job may take these GPUs",
            file=sys.stderr,
        )
    return 0


def run(args: argparse.Namespace) -> int:
    if args.hosts is not None:
        return on_hosts(args)
    from gpuwarden import config
    from gpuwarden.base.errors import UserError
    from gpuwarden.base.units import format_size
    from gpuwarden.files.locations import lease_location, state_location
    from gpuwarden.health.drain import list_drains
    from gpuwarden.health.xidlog import judged
    from gpuwarden.jobs.holding import allowed
    from gpuwarden.jobs.launch import export_value
    from gpuwarden.leases import EXIT_BUSY, list_leases
    from gpuwarden.machine.inventory import read_snapshot
    from gpuwarden.placement.request import Request
    from gpuwarden.placement.selection import choose

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
        judged(snapshot.gpus, conf=cfg),
    )
    if args.explain:
        from gpuwarden.placement.mig import devices

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
        import os

        # With a queue service, every way of holding GPUs takes its turn through it.
        holders = (
            "`gpuwarden run`, `reserve` or `submit` take GPUs through the queue service"
            if os.path.exists(cfg.service_socket())
            else "`gpuwarden run` or `gpuwarden reserve` hold them"
        )
        print(
            f"gpuwarden select: not reserved; another job may take these GPUs ({holders})",
            file=sys.stderr,
        )
    return 0
