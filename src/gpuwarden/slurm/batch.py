"""A gpuwarden request as a Slurm job: the batch script and `srun` options (pure).

The same words as `gpuwarden run`: `-g N` becomes `--gres=gpu:N` (typed,
`gpu:TYPE:N`, when `--model` names a GPU type the site configured under
`slurm.gpu_types`; otherwise `--model` becomes a node feature, `--constraint`).
With `ddp`, Slurm starts one task per GPU (`--ntasks-per-node`) through `srun`,
and `gpuwarden.torch.init_distributed` reads rank, world size and the master
address from Slurm's own variables; nothing else sets them.
"""

from __future__ import annotations

import sys

from gpuwarden.base.errors import UserError
from gpuwarden.base.units import is_digits

# `re`, `shlex` and `typing` are not imported: `submit --slurm` sits in front of every
# sbatch and should add little to it (bench/slurm_submit.py); these checks are simple.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence
    from typing import Optional

_ALNUM = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789")
# What may stand in a gres type or a feature expression without quoting trouble.
WORD = _ALNUM | frozenset("_.+-")
FEATURES = WORD | frozenset("&|*[]:()")
# What a shell word may hold unquoted (shlex.quote's set).
_SAFE = _ALNUM | frozenset("@%+=:,./-_")


def quote(word: str) -> str:
    """A shell word (shlex.quote without importing shlex and re)."""
    if word and all(c in _SAFE for c in word):
        return word
    return "'" + word.replace("'", "'\"'\"'") + "'"


class Value:
    """A plain value with keyword fields, compared and shown by them. Not a `@record`:
    dataclasses (with inspect and re) would be most of what `submit --slurm` imports."""

    FIELDS: tuple[tuple[str, object], ...] = ()  # (name, default); REQUIRED: none

    def __init__(self, **values: object) -> None:
        for name, default in self.FIELDS:
            value = values.pop(name, default)
            if value is REQUIRED:
                raise TypeError(f"{type(self).__name__} needs {name}")
            setattr(self, name, value)
        if values:
            raise TypeError(f"{type(self).__name__} has no field {next(iter(values))}")

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and vars(other) == vars(self)

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        body = ", ".join(f"{name}={getattr(self, name)!r}" for name, _ in self.FIELDS)
        return f"{type(self).__name__}({body})"


REQUIRED = object()


class JobSpec(Value):
    """What to ask Slurm for. `command` is the user's command line as given after `--`;
    `time` and `mem` are already in Slurm's form (see `slurm_time`, `slurm_mem`)."""

    FIELDS = (
        ("command", REQUIRED),
        ("gpus", 0),
        ("nodes", None),
        ("time", None),
        ("mem", None),
        ("gpu_type", None),
        ("constraint", None),
        ("ddp", False),
        ("output", None),
        ("name", None),
        ("partition", None),
        ("account", None),
        ("workdir", None),
        ("python", sys.executable),
        ("array", None),
        ("begin", None),
        ("signal", None),
    )
    if TYPE_CHECKING:
        command: tuple[str, ...]
        gpus: int
        nodes: Optional[int]
        time: Optional[str]
        mem: Optional[str]
        gpu_type: Optional[str]
        constraint: Optional[str]
        ddp: bool
        output: Optional[str]
        name: Optional[str]
        partition: Optional[str]
        account: Optional[str]  # sbatch's --account
        workdir: Optional[str]
        python: str
        array: Optional[str]  # sbatch's --array, as given (arrayspec checked it)
        begin: Optional[str]  # sbatch's --begin, as given (begintime checked it)
        signal: Optional[str]  # Slurm's --signal, as slurm_signal wrote it


def slurm_time(value: str) -> str:
    """A --time value in Slurm's form: Slurm's own forms pass through; gpuwarden's
    durations (90s, 30m, 4h, 2d) are converted; anything else is refused here, with
    the forms accepted, before Slurm says only "Invalid --time specification". The
    forms are read as the queue service reads them (`units.parse_time_limit`)."""
    from gpuwarden.base.units import UNLIMITED, is_slurm_time, parse_time_limit

    text = value.strip()
    seconds = parse_time_limit(text)  # refuses what neither path would read
    if text.upper() in UNLIMITED or is_slurm_time(text):
        return text
    if seconds is None:  # only Slurm's own forms mean no limit, and they pass above
        return text
    days, rest = divmod(round(seconds), 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{days}-{hours:02d}:{minutes:02d}:{secs:02d}"


def slurm_mem(value: str) -> str:
    """--mem in Slurm's form (a number with an optional K/M/G/T suffix; MiB by default).
    gpuwarden sizes such as 16GiB are accepted and rounded up to MiB."""
    text = value.strip()
    digits = text[:-1] if text[-1:].upper() in ("K", "M", "G", "T") else text
    if is_digits(digits):
        return text.upper()
    from gpuwarden.base.units import parse_size

    try:
        size = parse_size(text)
    except (UserError, ValueError):
        size = 0
    if size <= 0:
        raise UserError(f"invalid --mem {value!r}: expected a size such as 16G or 16GiB")
    return f"{-(-size // 2**20)}M"


def gres(spec: JobSpec) -> Optional[str]:
    if spec.gpus <= 0:
        return None
    if spec.gpu_type:
        return f"gpu:{spec.gpu_type}:{spec.gpus}"
    return f"gpu:{spec.gpus}"


def options(spec: JobSpec) -> list[str]:
    """The sbatch/srun options (one `--name=value` each) for the request."""
    out = []
    if spec.name:
        out.append(f"--job-name={spec.name}")
    if spec.partition:
        out.append(f"--partition={spec.partition}")
    if spec.account:
        out.append(f"--account={spec.account}")
    if spec.nodes is not None:
        out.append(f"--nodes={spec.nodes}")
    g = gres(spec)
    if g:
        out.append(f"--gres={g}")
    if spec.ddp:
        out.append(f"--ntasks-per-node={max(spec.gpus, 1)}")
    if spec.time:
        out.append(f"--time={spec.time}")
    if spec.mem:
        out.append(f"--mem={spec.mem}")
    if spec.constraint:
        out.append(f"--constraint={spec.constraint}")
    if spec.output:
        out.append(f"--output={spec.output}")
    if spec.workdir:
        out.append(f"--chdir={spec.workdir}")
    if spec.array:
        out.append(f"--array={spec.array}")
    if spec.begin:
        out.append(f"--begin={spec.begin}")
    if spec.signal:
        out.append(f"--signal={spec.signal}")
    return out


#: The most seconds before the limit Slurm's --signal takes (a 16-bit field).
MAX_SIGNAL_LEAD = 65535


def slurm_signal(
    warning: Optional[Mapping[str, object]], *, ddp: bool, attached: bool
) -> Optional[str]:
    """`--signal` (`jobs.options.warning_of`'s reading: number, seconds before, batch-only)
    in Slurm's form. Slurm signals a job's steps unless told `B:`, the batch script only.
    The batch script gpuwarden writes `exec`s the command, so without --ddp the command
    is that script and has no step: `B:` is what reaches it. With --ddp the tasks are
    srun's step, which Slurm's plain form signals (`B:` reaches srun, which passes the
    common signals on). `run --slurm` has no batch script: `B:` is refused there."""
    if warning is None:
        return None
    lead = int(warning["before"])  # type: ignore[call-overload]
    if lead > MAX_SIGNAL_LEAD:
        raise UserError(
            f"--signal: {lead} s before the limit; Slurm takes {MAX_SIGNAL_LEAD} at most"
        )
    if attached and warning["batch"]:
        raise UserError("--signal B: names a batch script; `run --slurm` has none (no B: there)")
    batch_only = warning["batch"] or not (ddp or attached)
    return f"{'B:' if batch_only else ''}{warning['number']}@{lead}"


def launch_argv(spec: JobSpec) -> list[str]:
    """What runs inside the allocation: the command itself, or with `ddp`, `srun` starting
    one task per GPU (a `.py` script or `-m module` runs under the submitting Python, as
    `gpuwarden run --ddp` does)."""
    cmd = list(spec.command)
    if not cmd:
        raise UserError("no command given after --, e.g. `-- python train.py`")
    if not spec.ddp:
        return cmd
    if _is_python(cmd[0]):
        cmd = cmd[1:]
        if not cmd:
            raise UserError("--ddp: no script given after --, e.g. `-- train.py --epochs 3`")
    if cmd[0] == "-m" or cmd[0].endswith(".py"):
        cmd = [spec.python, *cmd]
    return ["srun", "--kill-on-bad-exit=1", *cmd]


def _is_python(arg: str) -> bool:
    base = arg.rsplit("/", 1)[-1]
    return base.startswith("python") and all(c in "0123456789." for c in base[6:])


def script(spec: JobSpec) -> str:
    """The batch script `sbatch` reads on its standard input."""
    lines = ["#!/bin/bash", "# written by gpuwarden submit --slurm"]
    lines += [f"#SBATCH {opt}" for opt in options(spec)]
    lines.append(" ".join(quote(w) for w in ["exec", *launch_argv(spec)]))
    return "\n".join(lines) + "\n"


def srun_argv(spec: JobSpec) -> list[str]:
    """`run --slurm`: the attached job, one `srun` holding the terminal."""
    cmd = launch_argv(spec)
    if spec.ddp:
        cmd = cmd[2:]  # srun itself starts the tasks
    return ["srun", *options(spec), *cmd]


def check_word(what: str, value: str, allowed: frozenset[str] = WORD) -> str:
    if not value or not all(c in allowed for c in value):
        raise UserError(f"invalid {what} {value!r}: letters, digits and _.+- only")
    return value


def spec_of(
    command: Sequence[str],
    *,
    gpus: Optional[str] = None,
    nodes: Optional[str] = None,
    time: Optional[str] = None,
    mem: Optional[str] = None,
    model: Optional[str] = None,
    constraint: Optional[str] = None,
    gpu_types: Sequence[str] = (),
    ddp: bool = False,
    output: Optional[str] = None,
    name: Optional[str] = None,
    partition: Optional[str] = None,
    account: Optional[str] = None,
    workdir: Optional[str] = None,
    python: str = sys.executable,
    array: Optional[str] = None,
    begin: Optional[str] = None,
    signal: Optional[str] = None,
) -> JobSpec:
    """The JobSpec for command-line values (strings as typed); every bad value is one
    UserError line here rather than a Slurm error later."""
    count = 1
    if gpus is not None:
        if not is_digits(str(gpus).strip()):
            raise UserError(f"invalid GPU count {gpus!r}: expected a whole number, 0 or more")
        count = int(gpus)
    n_nodes = None
    if nodes is not None:
        if not is_digits(str(nodes).strip()) or int(nodes) < 1:
            raise UserError(f"invalid --nodes {nodes!r}: expected a whole number, 1 or more")
        n_nodes = int(nodes)
    gpu_type = None
    features = []
    if model is not None:
        types = {t.lower(): t for t in gpu_types}
        if model.lower() in types:
            gpu_type = types[model.lower()]
        else:
            features.append(check_word("--model", model))
    if constraint:
        features.append(check_word("--constraint", constraint, FEATURES))
    return JobSpec(
        command=tuple(command),
        gpus=count,
        nodes=n_nodes,
        time=None if time is None else slurm_time(time),
        mem=None if mem is None else slurm_mem(mem),
        gpu_type=gpu_type,
        constraint="&".join(features) or None,
        ddp=ddp,
        output=output,
        name=None if name is None else check_word("--name", name),
        partition=None if partition is None else check_word("--partition", partition),
        account=None if account is None else check_word("--account", account),
        workdir=workdir,
        python=python,
        array=None if array is None else array.strip(),
        begin=None if begin is None else begin.strip(),
        signal=signal,
    )
