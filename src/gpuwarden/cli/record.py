"""`gpuwarden record FILE.csv`: append per-GPU samples, like `nvidia-smi dmon` with owners."""

from __future__ import annotations

TYPE_CHECKING = False  # argparse is read only by type checkers here
if TYPE_CHECKING:
    import argparse

    from gpuwarden.cli import Commands


def register(commands: Commands, name: str) -> None:
    from gpuwarden.cli import subcommand

    parser = subcommand(commands, name)
    parser.add_argument("file", metavar="FILE.csv", help="CSV file to append to")
    parser.add_argument(
        "--interval",
        type=float,
        metavar="SECONDS",
        help="seconds between samples",
    )
    parser.add_argument("--count", type=int, metavar="N", help="stop after N samples")
    parser.add_argument(
        "--max-bytes", metavar="SIZE", help="rotate the file beyond this size (record.max_bytes)"
    )


def run(args: argparse.Namespace) -> int:
    import logging

    from gpuwarden import config as config_module
    from gpuwarden.base.errors import UserError
    from gpuwarden.monitoring.sampling import record

    config = config_module.load(
        {"record.interval": args.interval, "record.max_bytes": args.max_bytes}
    )
    interval = float(config.get("record.interval"))
    if interval <= 0:
        raise UserError(f"invalid interval {interval:g}: expected seconds > 0")
    if args.count is not None and args.count < 1:
        raise UserError(f"invalid count {args.count}: expected 1 or more")
    log = logging.getLogger("gpuwarden.record")
    log.info(
        "recording to %s every %gs%s",
        args.file,
        interval,
        f", {args.count} samples" if args.count else "; Ctrl-C to stop",
    )
    try:
        done = record(
            args.file,
            interval=interval,
            count=args.count,
            max_bytes=int(config.get("record.max_bytes")),
        )
    except KeyboardInterrupt:
        return 0
    log.info("wrote %d samples to %s", done, args.file)
    return 0
