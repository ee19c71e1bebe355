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
    from typing import Optional, Union

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
