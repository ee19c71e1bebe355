"""`gpuwarden exporter`: serve /metrics and run the health watch beside it."""

from __future__ import annotations

import sys

TYPE_CHECKING = False  # argparse is read only by type checkers here
if TYPE_CHECKING:
    import argparse

    from gpuwarden.cli import Commands


def register(commands: Commands, name: str) -> None:
    from gpuwarden.cli import subcommand
    from gpuwarden.cli.serving import add_watch_and_once

    parser = subcommand(commands, name)
    parser.add_argument(
        "--listen", metavar="HOST:PORT", help="address to serve (exporter.listen, 127.0.0.1:9400)"
    )
    parser.add_argument(
        "--dcgm-compat",
        action="store_true",
        default=None,
        help="also emit dcgm-exporter's DCGM_FI_* names and labels (exporter.dcgm_compat)",
    )
    add_watch_and_once(parser, "the metrics")


def run(args: argparse.Namespace) -> int:
    from gpuwarden import config as config_module
    from gpuwarden.cli.serving import until_signalled, warner
    from gpuwarden.exporter import metrics, server
    from gpuwarden.health.judgement import rules_in_force
    from gpuwarden.health.watch import watch_beside

    _warn = warner("gpuwarden.exporter")

    server.require_client()  # before reading anything, `--once` included
    config = config_module.load(
        {"exporter.listen": args.listen, "exporter.dcgm_compat": args.dcgm_compat}
    )
    listen = str(config.get("exporter.listen"))
    dcgm = bool(config.get("exporter.dcgm_compat"))
    rules = rules_in_force(config, _warn)
    cache = server.ViewCache(
        cache_seconds=float(config.get("exporter.cache_seconds")),
        idle_util=float(config.get("exporter.idle_util")),
        idle_after=float(config.get("exporter.idle_seconds")),
        rules=rules,
        counters=dcgm,
        show_commands=bool(config.get("exporter.show_commands")),
        socket=config.service_socket(),
    )
    if args.once:
        cache.prime()  # the profiling counters need a sample to measure from
        sys.stdout.write(metrics.render(cache.get(), dcgm))
        return 0
    watch = None
    if not args.no_watch:
        watch = watch_beside(config, cache.snapshot, rules, _warn, "metrics and drains")
    running = server.serve(listen, dcgm_compat=dcgm, cache=cache, watch=watch)
    host = f"[{running.host}]" if ":" in running.host else running.host
    _warn(
        f"serving http://{host}:{running.port}/metrics"
        + (" with DCGM names" if dcgm else "")
        + ("" if watch else " (health watch off)")
    )
    return until_signalled(running.close)
