"""Job arrays and parameter sweeps as Slurm's `sbatch --array` reads them — pure functions.

`parse("0-99%8")` is the array's task ids and its throttle (at most 8 tasks at once);
`sweep(["lr=0.1,0.01", "seed=1,2,3"])` is a cartesian product, one task per
combination, whose values `combination` gives a task by its index. `compact` writes
task ids back the way squeue shows them (`40-99`), and `output_path` fills in sbatch's
filename patterns (`%A`, `%a`, `%j`). Every malformed value is one `UserError` line
that names what is wrong, and nothing is expanded before its size is known, so
`0-99999999999` is refused without building a list.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from typing import NamedTuple, Optional

from gpuwarden.base.errors import UserError

#: Tasks one array may have: Slurm's default MaxArraySize is 1001 (ids 0-1000); a lab
#: box's own bound is the per-user job limit, which the service checks as well.
MAX_TASKS = 10_000
#: The largest task id (Slurm's MaxArraySize at most 4,000,001).
MAX_TASK_ID = 4_000_000
#: Names and values of one sweep's parameters.
MAX_PARAMS = 32
MAX_VALUE = 4096

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,63}")
_PATTERN = re.compile(r"%(\d{0,2})([Aaju%])")


class ArraySpec(NamedTuple):
    """An array's task ids (ascending, no repeats) and its throttle (None: no bound)."""

    tasks: tuple[int, ...]
    throttle: Optional[int] = None


def parse(text: str, most: int = MAX_TASKS) -> ArraySpec:
    """`0-15`, `0-15:4`, `1,3,7`, `0-99%8` (and combinations, `0-3,10-20:5%2`), as
    sbatch's `--array`: at most `most` tasks, ids 0 to MAX_TASK_ID."""
    spec = text.strip()
    if not spec:
        raise UserError("empty --array: give task ids such as 0-99 or 1,3,7 (%N: N at once)")
    throttle: Optional[int] = None
    body, percent, limit = spec.partition("%")
    if percent:
        if not _number(limit) or not 1 <= int(limit) <= MAX_TASKS:
            raise UserError(
                f"invalid --array {spec[:80]!r}: %{limit[:20]} must be a whole number of tasks "
                f"from 1 to {MAX_TASKS}"
            )
        throttle = int(limit)
    parts = [_part(spec, piece) for piece in body.split(",")]
    total = sum(len(r) for r in parts)
    if total > most:
        raise UserError(f"--array {spec!r} has {total} tasks; the most an array may have is {most}")
    tasks = sorted({t for r in parts for t in r})
    return ArraySpec(tuple(tasks), throttle)


def _part(spec: str, piece: str) -> range:
    """One comma-separated piece: `7`, `0-15` or `0-15:4`, as a range (not expanded)."""
    piece = piece.strip()
    bounds, colon, step_text = piece.partition(":")
    first, dash, last = bounds.partition("-")
    step = 1
    if colon:
        if not dash or not _number(step_text) or int(step_text) < 1:
            raise UserError(
                f"invalid --array {spec!r}: {piece!r} needs a range and a step of 1 or more "
                "(0-15:4)"
            )
        step = int(step_text)
    if not _number(first) or (dash and not _number(last)):
        raise UserError(
            f"invalid --array {spec!r}: {piece!r} is not a task id or a range (7, 0-15, 0-15:4)"
        )
    low = int(first)
    high = int(last) if dash else low
    if high < low:
        raise UserError(f"invalid --array {spec!r}: the range {piece!r} ends before it starts")
    if high > MAX_TASK_ID:
        raise UserError(f"invalid --array {spec!r}: task ids go up to {MAX_TASK_ID}")
    return range(low, high + 1, step)


def _number(text: str) -> bool:
    return text.isascii() and text.isdigit() and len(text) <= 12


def throttle_only(text: str) -> Optional[int]:
    """`%8` beside `--param` (whose product says which tasks there are): the throttle."""
    spec = text.strip()
    if not spec.startswith("%"):
        raise UserError(
            f"--array {spec!r} beside --param: the product names the tasks; "
            "give only a throttle such as %8"
        )
    return parse("0" + spec).throttle


# --- sweeps --------------------------------------------------------------------


class Param(NamedTuple):
    """One swept parameter: its name and its values, in the order given."""

    name: str
    values: tuple[str, ...]


def sweep(words: Iterable[str]) -> tuple[Param, ...]:
    """`--param name=v1,v2 ...` (repeatable): the parameters of a cartesian product."""
    params: list[Param] = []
    for word in words:
        name, eq, listed = word.partition("=")
        name = name.strip()
        if not eq or not _NAME.fullmatch(name):
            raise UserError(
                f"invalid --param {word[:80]!r}: expected NAME=V1,V2,... with NAME of letters, "
                "digits and _"
            )
        values = tuple(v.strip() for v in listed.split(","))
        if not all(values):
            raise UserError(f"invalid --param {word[:80]!r}: an empty value")
        if any(len(v) > MAX_VALUE or "\0" in v for v in values):
            raise UserError(f"invalid --param {name}: a value over {MAX_VALUE} characters")
        if any(p.name.upper() == name.upper() for p in params):
            raise UserError(f"--param {name} is given twice")
        params.append(Param(name, values))
    if len(params) > MAX_PARAMS:
        raise UserError(f"{len(params)} --param names; the most is {MAX_PARAMS}")
    return tuple(params)


def size(params: Sequence[Param]) -> int:
    """How many tasks the product has (1 for no parameters)."""
    total = 1
    for param in params:
        total *= len(param.values)
    return total


def combination(params: Sequence[Param], index: int) -> dict[str, str]:
    """The values of task `index` of the product, the last parameter varying fastest
    (as nested loops in the order given)."""
    chosen: dict[str, str] = {}
    for param in reversed(params):
        index, at = divmod(index, len(param.values))
        chosen[param.name] = param.values[at]
    return {p.name: chosen[p.name] for p in params}


def env_name(name: str) -> str:
    """The variable a parameter's value is in: `lr` -> `GPUWARDEN_PARAM_LR`."""
    return "GPUWARDEN_PARAM_" + name.upper()


# --- showing and naming ----------------------------------------------------------


def compact(tasks: Iterable[int]) -> str:
    """Task ids as squeue shows them: `0-3,7,9-12`."""
    ordered = sorted(set(tasks))
    pieces: list[str] = []
    start = 0
    while start < len(ordered):
        end = start
        while end + 1 < len(ordered) and ordered[end + 1] == ordered[end] + 1:
            end += 1
        low, high = ordered[start], ordered[end]
        pieces.append(str(low) if low == high else f"{low}-{high}")
        start = end + 1
    return ",".join(pieces)


def label(array: int, tasks: Sequence[int], throttle: Optional[int] = None) -> str:
    """`12_7` for one task, `12_[40-99%8]` for several, as squeue names them."""
    if len(tasks) == 1 and throttle is None:
        return f"{array}_{tasks[0]}"
    return f"{array}_[{compact(tasks)}{'' if throttle is None else f'%{throttle}'}]"


def task_name(text: str) -> Optional[tuple[int, int]]:
    """`12_7` as (array 12, task 7); None for anything else."""
    array, underscore, task = text.partition("_")
    if not underscore or not _number(array) or not _number(task) or int(array) < 1:
        return None
    return int(array), int(task)


def output_path(pattern: str, values: Mapping[str, object]) -> str:
    """sbatch's filename patterns filled in: `%A` the array's id, `%a` the task id, `%j`
    the job's own id, `%u` the user (`values["u"]`), `%%` a percent sign; a number
    between `%` and the letter pads with zeros (`%3a` -> `007`)."""

    def fill(match: re.Match[str]) -> str:
        width, letter = match.group(1), match.group(2)
        if letter == "%":
            return "%"
        value = values.get(letter)
        if value is None:
            return match.group(0)
        return str(value).zfill(int(width)) if width else str(value)

    return _PATTERN.sub(fill, pattern)
