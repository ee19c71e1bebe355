"""`gpuwarden serve`: run the queue service for this machine (root; docs/service.md)."""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    import argparse

    from gpuwarden.cli import Commands


def register(commands: Commands, name: str) -> None:
    import argparse

    from gpuwarden.cli import LOG_LEVELS, subcommand

    parser = subcommand(commands, name)
    parser.add_argument(
        "--socket", metavar="PATH", help="Unix socket to serve (default: service.socket)"
    )
    parser.add_argument(
        "--state-dir",
        metavar="DIR",
        help="journal and job records (default /var/lib/gpuwarden/service)",
    )
    parser.add_argument(
        "--admin", action="append", metavar="USER|@GROUP", help="an admin (repeatable)"
    )
    parser.add_argument(
        "--max-gpus-per-user", type=int, metavar="N", help="GPUs a user may use at once"
    )
    parser.add_argument(
        "--max-jobs-per-user", type=int, metavar="N", help="jobs a user may have queued"
    )
    parser.add_argument(
        "--max-time", metavar="DURATION", help="longest --time allowed (then required)"
    )
    parser.add_argument(
        "--grace", metavar="DURATION", default="30s", help="SIGTERM to SIGKILL (30s)"
    )
    parser.add_argument(
        "--show-commands", action="store_true", help="show everyone's commands in queue"
    )
    # The global `gpuwarden --log-level`, also accepted after the command as it always
    # was; SUPPRESS leaves the global value in place when it is not given here.
    parser.add_argument(
        "--log-level",
        type=str.lower,
        choices=LOG_LEVELS,
        default=argparse.SUPPRESS,
        metavar="LEVEL",
        help="what the service logs: debug, info (default), warning or error",
    )


def run(args: argparse.Namespace) -> int:
    import os

    from gpuwarden import config, scheduling
    from gpuwarden.enforcement import Policy as EnforcePolicy
    from gpuwarden.errors import UserError
    from gpuwarden.inventory import read_snapshot
    from gpuwarden.service.identity import Admins
    from gpuwarden.service.server import Service
    from gpuwarden.service.settings import Settings
    from gpuwarden.units import parse_duration

    if os.geteuid() != 0:
        raise UserError("the service runs as root: it starts each job as the user who submitted it")
    cfg = config.load()

    def pick(option: object, key: str) -> object:
        return cfg.get(key) if option is None else option

    for name, value in (
        ("--max-gpus-per-user", args.max_gpus_per_user),
        ("--max-jobs-per-user", args.max_jobs_per_user),
    ):
        if value is not None and value < 1:
            raise UserError(f"{name} must be 1 or more")
    policy = scheduling.Policy(
        weight_fairshare=cfg.get("service.weight_fairshare"),
        weight_age=cfg.get("service.weight_age"),
        weight_qos=cfg.get("service.weight_qos"),
        weight_nice=cfg.get("service.weight_nice"),
        age_max=cfg.get("service.age_max"),
        half_life=cfg.get("service.half_life"),
        shares=dict(cfg.get("service.shares") or {}),
        max_gpus_per_user=pick(args.max_gpus_per_user, "service.max_gpus_per_user"),  # type: ignore[arg-type]
        starve_after=cfg.get("service.starve_after"),
    )
    max_time = (
        cfg.get("service.max_time") if args.max_time is None else parse_duration(args.max_time)
    )
    settings = Settings(
        socket=args.socket or cfg.get("service.socket"),
        state_dir=args.state_dir or cfg.get("service.dir"),
        policy=policy,
        admins=Admins.parse([*cfg.get("service.admins"), *(args.admin or ())]),
        max_jobs_per_user=pick(args.max_jobs_per_user, "service.max_jobs_per_user"),  # type: ignore[arg-type]
        max_time=max_time,
        show_commands=args.show_commands or cfg.get("service.show_commands"),
        grace=cfg.get("service.grace") if args.grace is None else parse_duration(args.grace),
        webhook=cfg.get("service.webhook"),
        sendmail=cfg.get("service.sendmail"),
        devices=cfg.get("enforce.devices"),
        enforce=EnforcePolicy.from_config(cfg),
        enforce_every=cfg.get("enforce.poll_seconds"),
        max_clients_per_user=cfg.get("service.max_connections_per_user"),
        idle_timeout=cfg.get("service.idle_timeout"),
        max_command_bytes=cfg.get("service.max_command_bytes"),
        max_env_bytes=cfg.get("service.max_env_bytes"),
    )
    # Scheduling and enforcement decide on memory, processes and health alone.
    Service(settings, lambda: read_snapshot(detail=False)).serve_forever()
    return 0
