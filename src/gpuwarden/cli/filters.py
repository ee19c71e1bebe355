"""The options that say which GPUs fit, shared by `run`, `reserve` and `select`.

One definition, so the three commands accept the same filters with the same
meaning, and their values reach `gpuwarden.config.load(cli=...)` under the
same keys (the dests are the config keys' last parts).
"""

from __future__ import annotations

from gpuwarden.errors import UserError

TYPE_CHECKING = False
if TYPE_CHECKING:
    import argparse
    from typing import Any, Optional, Union

    Declared = Union[argparse.ArgumentParser, argparse._ArgumentGroup]


def add_filters(parser: Declared) -> None:
    parser.add_argument(
        "--gpus", metavar="IDS", help="candidates: nvidia-smi indices or UUID prefixes"
    )
    parser.add_argument("--min-free", metavar="SIZE", help="at least this much free memory (20GiB)")
    parser.add_argument("--max-util", metavar="PCT", help="at most this utilization (percent)")
    parser.add_argument("--min-capability", metavar="X.Y", help="at least this compute capability")
    parser.add_argument("--model", metavar="PATTERN", help="GPU name glob or substring, any case")
    parser.add_argument("--exclude", metavar="IDS", help="never these GPUs")
    parser.add_argument(
        "--mem", metavar="SIZE", help="a shared lease declaring this much memory (not a whole GPU)"
    )


def settings(args: argparse.Namespace) -> dict[str, object]:
    """Command-line values as `gpuwarden.config.load(cli=...)` takes them (None: not given)."""
    count = args.count
    if count is not None and not str(count).strip().isdigit():
        raise UserError(f"invalid GPU count {count!r}: expected a whole number, 0 or more")
    return {
        "run.count": count,
        "run.gpus": args.gpus,
        "run.min_free": args.min_free,
        "run.max_util": args.max_util,
        "run.min_capability": args.min_capability,
        "run.model": args.model,
        "run.exclude": args.exclude,
    }


def mem_of(args: argparse.Namespace) -> Optional[int]:
    """The declared share in bytes, or None for whole GPUs."""
    if args.mem is None:
        return None
    from gpuwarden.units import parse_size

    mem = parse_size(args.mem)
    if mem <= 0:
        raise UserError(f"invalid --mem {args.mem!r}: expected a size above zero")
    return mem


def add_lease_options(parser: argparse.ArgumentParser) -> None:
    """Which GPUs fit (as `select`), plus what holding them takes: `run` and `reserve`."""
    pick = parser.add_argument_group("which GPUs (defaults come from `gpuwarden config`)")
    pick.add_argument("-g", "--count", metavar="N", help="how many GPUs (0: none, CPU only)")
    add_filters(pick)
    pick.add_argument("--wait", action="store_true", default=None, help="wait in line for GPUs")
    pick.add_argument("--timeout", metavar="T", help="with --wait: give up after T (90s, 5m, 2h)")
    pick.add_argument(
        "--uuid", action="store_true", help="CUDA_VISIBLE_DEVICES as UUIDs, not indices"
    )


def request_of(args: argparse.Namespace) -> tuple[Any, Any]:
    """(config, selection.Request) from the options, over the configured defaults."""
    from gpuwarden import config as cfg
    from gpuwarden.selection import Request

    if getattr(args, "cpu", False):
        if args.count not in (None, "0"):
            raise UserError("--cpu hides every GPU; it cannot be combined with -g " + args.count)
        args.count = "0"
    conf = cfg.load(
        {
            **settings(args),
            "run.wait": args.wait,
            "run.timeout": args.timeout,
            "run.id_format": "uuid" if args.uuid else None,
        }
    )
    mem = mem_of(args)
    if conf.get("run.timeout") is not None and not conf.get("run.wait"):
        raise UserError("--timeout only applies with --wait")
    return conf, Request.from_config(conf, mem=mem)
