"""The options that say which GPUs fit and how a job is held, shared by `run`,
`reserve`, `select`, `submit` and the service's reading of a submit's command line
(`queueclient.submitting`).

One definition, so the commands accept the same filters with the same meaning,
and their values reach `gpuwarden.config.load(cli=...)` under the same keys (the
dests are the config keys' last parts).
"""

from __future__ import annotations

from gpuwarden.base.errors import UserError
from gpuwarden.base.units import is_digits

TYPE_CHECKING = False
if TYPE_CHECKING:
    import argparse
    from typing import Any, Optional, Union

    from gpuwarden.config import Config
    from gpuwarden.placement.request import Request

    Declared = Union[argparse.ArgumentParser, argparse._ArgumentGroup]


def add_filters(parser: Declared, *, slurm: bool = False) -> None:
    """The selection filters. With `slurm` (`submit`, which also hands jobs to Slurm),
    each says what it means there: Slurm has no equivalent for most of them."""
    local = " (not with --slurm)" if slurm else ""
    parser.add_argument(
        "--gpus", metavar="IDS", help="candidates: nvidia-smi indices or UUID prefixes" + local
    )
    parser.add_argument(
        "--min-free", metavar="SIZE", help="at least this much free memory (20GiB)" + local
    )
    parser.add_argument(
        "--max-util", metavar="PCT", help="at most this utilization (percent)" + local
    )
    parser.add_argument(
        "--min-capability", metavar="X.Y", help="at least this compute capability" + local
    )
    parser.add_argument(
        "--model",
        metavar="PATTERN",
        help="GPU name glob or substring, any case"
        + ("; with --slurm a gres type" if slurm else ""),
    )
    parser.add_argument("--exclude", metavar="IDS", help="never these GPUs" + local)
    parser.add_argument(
        "--mig", metavar="PROFILE", help="a MIG slice of this profile, e.g. 1g.10gb" + local
    )
    parser.add_argument(
        "--mem",
        metavar="SIZE",
        help="a shared lease declaring this much memory (not a whole GPU)"
        + ("; with --slurm host memory" if slurm else ""),
    )


def settings(args: argparse.Namespace) -> dict[str, object]:
    """Command-line values as `gpuwarden.config.load(cli=...)` takes them (None: not given)."""
    count = args.count
    if count is not None and not is_digits(str(count).strip()):
        raise UserError(f"invalid GPU count {count!r}: expected a whole number, 0 or more")
    for flag, value in (("--gpus", args.gpus), ("--model", args.model)):
        if value is not None and not value.strip():  # not "no constraint": a slip
            raise UserError(f"{flag} is empty; leave it out to allow any GPU")
    return {
        "run.count": count,
        "run.gpus": args.gpus,
        "run.min_free": args.min_free,
        "run.max_util": args.max_util,
        "run.min_capability": args.min_capability,
        "run.model": args.model,
        "run.exclude": args.exclude,
        "run.mig": args.mig,
        "submit.account": getattr(args, "account", None),
    }


def mem_of(args: argparse.Namespace) -> Optional[int]:
    """The declared share in bytes, or None for whole GPUs."""
    if args.mem is None:
        return None
    from gpuwarden.base.units import parse_size

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


def add_time_option(parser: Declared) -> None:
    """`--time` of `run` and `submit`, read as Slurm reads it (`units.parse_time_limit`)."""
    parser.add_argument(
        "--time",
        metavar="T",
        help="time limit, with the queue service or --slurm: SIGTERM at T, SIGKILL after a "
        "grace; a bare number is minutes, as in Slurm (90, 1:30:00, 2-00, 30m, 4h)",
    )
    parser.add_argument(
        "--signal",
        metavar="[B:]SIG[@SECONDS]",
        help="with --time: send SIG that many seconds (60) before the limit, as Slurm's "
        "--signal (and at preemption); B: only to the job's first process (USR1@120, B:TERM@300)",
    )


def warning_of(args: argparse.Namespace) -> Optional[dict[str, Any]]:
    """`--signal=[B:]SIG[@SECONDS]` as the queue service takes it, read as Slurm reads it:
    SIG a name (USR1, SIGUSR1) or a number, SECONDS 60 when left out."""
    import signal

    text = getattr(args, "signal", None)
    if text is None:
        return None
    spec, batch = text, False
    if spec[:2].upper() == "B:":
        spec, batch = spec[2:], True
    name, _, seconds = spec.partition("@")
    bad = UserError(
        f"invalid --signal {text!r}: expected [B:]SIG[@SECONDS], e.g. USR1@120 or B:TERM@300"
    )
    if name.isdigit():
        number = int(name)
    else:
        upper = name.upper()
        member = getattr(signal.Signals, upper if upper.startswith("SIG") else "SIG" + upper, None)
        if member is None:
            raise bad
        number = int(member)
    if not 1 <= number <= 64 or (seconds and not seconds.isdigit()):
        raise bad
    if args.time is None and not getattr(args, "preemptible", False):
        raise UserError("--signal needs --time: its signal comes that long before the limit")
    return {"number": number, "before": float(seconds or 60), "batch": batch}


def add_account_option(parser: Declared) -> None:
    """`--account` of `run`, `submit` and `kernel install` (submit.account by default)."""
    parser.add_argument(
        "--account",
        metavar="NAME",
        help="charge its GPU-hours to this account (as sbatch's; default: submit.account)",
    )


def add_slurm_options(parser: argparse.ArgumentParser, what: str) -> argparse._ArgumentGroup:
    """The options only Slurm reads, shared by `run --slurm` and `submit --slurm`; the
    group, for a command's own Slurm options."""
    slurm = parser.add_argument_group("Slurm (docs/slurm.md)")
    slurm.add_argument("--slurm", action="store_true", help=what)
    slurm.add_argument("--nodes", metavar="K", help="with --slurm: this many nodes")
    slurm.add_argument("--constraint", metavar="FEATURES", help="with --slurm: node features")
    slurm.add_argument("--partition", metavar="NAME", help="with --slurm: the partition")
    return slurm


def request_of(args: argparse.Namespace) -> tuple[Config, Request]:
    """(config, request.Request) from the options, over the configured defaults."""
    from gpuwarden import config as cfg
    from gpuwarden.placement.request import Request

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
    # The option without waiting is a mistake on this command line; a configured
    # `run.timeout` (a file's, an environment variable's) limits waiting wherever it is
    # on and leaves a run that does not wait alone.
    if args.timeout is not None and not conf.get("run.wait"):
        raise UserError("--timeout only applies with --wait")
    return conf, Request.from_config(conf, mem=mem)


def command_of(args: argparse.Namespace) -> list[str]:
    """The job's command: the words after `--` (or after the options)."""
    cmd = list(args.cmd or [])
    if cmd and cmd[0] == "--":
        cmd = cmd[1:]
    if not cmd:
        raise UserError("no command given after --, e.g. `-- python train.py`")
    return cmd


def job_ids(words: list[str]) -> list[int]:
    """Job ids from the command line (`12 13` or `12,13`); anything else is one line."""
    ids = []
    for word in words:
        for part in word.split(","):
            part = part.strip()
            if not is_digits(part) or int(part) <= 0:
                raise UserError(f"invalid job id {part!r}: expected a number such as 12")
            ids.append(int(part))
    return ids
