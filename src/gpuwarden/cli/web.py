"""`gpuwarden web`: serve the live page of this machine (docs/web.md)."""

from __future__ import annotations

TYPE_CHECKING = False  # argparse is read only by type checkers here
if TYPE_CHECKING:
    import argparse

    from gpuwarden.cli import Commands


def register(commands: Commands, name: str) -> None:
    from gpuwarden.cli import subcommand
    from gpuwarden.cli.serving import add_watch_and_once

    parser = subcommand(commands, name)
    parser.add_argument(
        "--listen",
        metavar="HOST:PORT",
        help="address to serve (web.listen, 127.0.0.1:9500; port 0: any free one)",
    )
    parser.add_argument(
        "--interval", metavar="SECONDS", help="seconds between updates (web.interval, 1)"
    )
    parser.add_argument(
        "--show-commands",
        action="store_true",
        default=None,
        help="show processes' command lines (web.show_commands; hidden by default)",
    )
    parser.add_argument(
        "--socket",
        metavar="PATH",
        help="the queue service's socket to show (service.socket); the page asks it as "
        "the user running `gpuwarden web`: run it as an unprivileged user",
    )
    parser.add_argument(
        "--peers",
        nargs="+",
        metavar="URL",
        help="other hosts' pages (http://gpu2:9500/) shown on this one, from their JSON API",
    )
    add_watch_and_once(parser, "the API document")


def run(args: argparse.Namespace) -> int:
    import json

    from gpuwarden import config as config_module
    from gpuwarden.base.errors import UserError
    from gpuwarden.base.units import parse_listen
    from gpuwarden.cli.serving import until_signalled, warner
    from gpuwarden.health.judgement import rules_in_force
    from gpuwarden.health.watch import watch_beside
    from gpuwarden.web.server import Feed, serve

    _warn = warner("gpuwarden.web")
    from gpuwarden.web.peers import check_url

    peers = [check_url(url) for url in args.peers or ()]
    if args.listen is not None:
        parse_listen(args.listen, any_port=True)  # checked here: port 0 (any free port) too
    config = config_module.load(
        {"web.interval": args.interval, "web.show_commands": args.show_commands}
    )
    interval = float(config.get("web.interval"))
    if not 0.1 <= interval <= 3600:
        raise UserError(f"web.interval must be between 0.1 and 3600 seconds, got {interval:g}")
    rules = rules_in_force(config, _warn)
    feed = Feed(
        interval=interval,
        show_commands=bool(config.get("web.show_commands")),
        rules=rules,
        service=args.socket or config.service_socket(),
        peers=peers,
    )
    if args.once:
        print(json.dumps(feed.document(), indent=2))
        return 0
    watch = (
        None
        if args.no_watch
        else watch_beside(config, feed.snapshot, rules, _warn, "the page and drains")
    )
    feed.watch = watch
    server = serve(
        args.listen if args.listen is not None else str(config.get("web.listen")),
        feed=feed,
        watch=watch,
        max_clients=int(config.get("web.max_clients")),
    )
    import logging

    logging.getLogger("gpuwarden.web").info(
        "serving %s%s", server.url, "" if watch else " (health watch off)"
    )
    return until_signalled(server.close)
