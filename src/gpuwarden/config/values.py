"""The value types of settings: each kind's normaliser, and how to name it in an error.

Values are normalised on the way in (sizes to bytes, durations to seconds, ID
lists to tuples of strings), so a wrong type is reported once, by the loader
(`gpuwarden.config`), naming where the value came from, the key and the expected
type, never deep inside the code that uses it. The parsing of sizes, durations
and addresses itself is `gpuwarden.base.units`'s.
"""

from __future__ import annotations

import os
import re

from gpuwarden.base.errors import UserError
from gpuwarden.base.units import parse_duration, parse_size

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any


class BadValue(Exception):
    """Raised by a normaliser; the loader adds where the value came from."""


def _as_str(value: Any) -> str:
    if not isinstance(value, str):
        raise BadValue
    return value


def _as_bool(value: Any) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str):
        text = value.strip().lower()
        if text in ("1", "true", "yes", "on"):
            return True
        if text in ("0", "false", "no", "off"):
            return False
    raise BadValue


def _as_int(value: Any) -> int:
    if isinstance(value, bool):
        raise BadValue
    if isinstance(value, int):
        return value
    if isinstance(value, str):
        try:
            return int(value.strip())
        except ValueError:
            raise BadValue from None
    raise BadValue


def _as_float(value: Any) -> float:
    if isinstance(value, bool):
        raise BadValue
    if isinstance(value, (int, float)):
        number = float(value)
    elif isinstance(value, str):
        try:
            number = float(value.strip())
        except ValueError:
            raise BadValue from None
    else:
        raise BadValue
    if number != number or number in (float("inf"), float("-inf")):  # NaN, infinities
        raise BadValue
    return number


def _as_seconds(value: Any) -> float:
    """A number of seconds up to ten years: `time.sleep(1e300)` raises OverflowError."""
    from gpuwarden.base.units import MAX_DURATION

    number = _as_float(value)
    if number > MAX_DURATION:
        raise BadValue
    return number


def _as_percent(value: Any) -> float:
    if isinstance(value, str):
        value = value.strip()
        value = value[:-1] if value.endswith("%") else value  # one sign: "50%%" is no number
    number = _as_float(value)
    if not 0 <= number <= 100:
        raise BadValue
    return number


def _as_size(value: Any) -> int:
    if isinstance(value, bool):
        raise BadValue
    if isinstance(value, int):
        if value < 0:
            raise BadValue
        return value
    if isinstance(value, str):
        try:
            return parse_size(value)
        except UserError:
            raise BadValue from None
    raise BadValue


def _as_duration(value: Any) -> float:
    try:
        return parse_duration(value)
    except UserError:
        raise BadValue from None


def _as_ids(value: Any) -> tuple[str, ...]:
    """GPU IDs as typed: `"0,2"`, `[0, 2]`, `["GPU-3f2a"]`; kept as strings for select."""
    if isinstance(value, str):
        parts = [p.strip() for p in value.split(",")]
        if any(not p for p in parts) and value.strip():
            raise BadValue
        return tuple(p for p in parts if p)
    if isinstance(value, int) and not isinstance(value, bool):
        return (str(value),)
    if isinstance(value, (list, tuple)):
        out = []
        for item in value:
            if (
                isinstance(item, bool)
                or not isinstance(item, (int, str))
                or str(item).strip() == ""
            ):
                raise BadValue
            out.append(str(item).strip())
        return tuple(out)
    raise BadValue


def _as_ints(value: Any) -> tuple[int, ...]:
    if isinstance(value, str):
        value = [p for p in value.replace(" ", "").split(",") if p]
    if not isinstance(value, (list, tuple)):
        raise BadValue
    return tuple(_as_int(v) for v in value)


def _as_names(value: Any) -> tuple[str, ...]:
    """User or group names (`@group`): a list, or one comma-separated string."""
    if isinstance(value, str):
        value = [p.strip() for p in value.split(",")] if value.strip() else []
    if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) and v for v in value):
        raise BadValue
    return tuple(value)


def _as_shares(value: Any) -> dict[str, float]:
    """Fair-share weights per user: a table `{alice = 2, bob = 1}` or `"alice=2,bob=1"`."""
    if isinstance(value, str):
        pairs = [p.split("=", 1) for p in value.split(",") if p.strip()]
        if any(len(p) != 2 for p in pairs):
            raise BadValue
        value = {k.strip(): v.strip() for k, v in pairs}
    if not isinstance(value, dict):
        raise BadValue
    shares = {}
    for user, share in value.items():
        number = _as_float(share)
        if not user or not number > 0:
            raise BadValue
        shares[str(user)] = number
    return shares


def _as_limits(value: Any) -> dict[str, dict[str, float]]:
    """`[service.limits]`: user or @group -> {max_gpus, max_jobs, max_time,
    max_interactive_time, gpu_hours_per_week} (service.limits)."""
    if not isinstance(value, dict):
        raise BadValue
    table: dict[str, dict[str, float]] = {}
    for name, limits in value.items():
        if not isinstance(name, str) or not name.strip("@") or not isinstance(limits, dict):
            raise BadValue
        entry: dict[str, float] = {}
        for kind, raw in limits.items():
            if kind in ("max_gpus", "max_jobs"):
                number: float = _as_int(raw)
            elif kind in ("max_time", "max_interactive_time"):
                number = _as_duration(raw)
            elif kind == "gpu_hours_per_week":
                number = _as_float(raw)
            else:
                raise BadValue
            if not number > 0:
                raise BadValue
            entry[kind] = number
        table[name] = entry
    return table


def _as_accounts(value: Any) -> dict[str, dict[str, Any]]:
    """`[service.accounts]`: account -> {members = [users, @groups], share, max_gpus,
    max_jobs, max_time, gpu_hours_per_week} (service.accounts)."""
    import re

    if not isinstance(value, dict):
        raise BadValue
    table: dict[str, dict[str, Any]] = {}
    for name, entry in value.items():
        if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z0-9][\w.-]{0,63}", name):
            raise BadValue
        if not isinstance(entry, dict) or "members" not in entry:
            raise BadValue
        limits = {k: v for k, v in entry.items() if k not in ("members", "share")}
        if set(limits) - {"max_gpus", "max_jobs", "max_time", "gpu_hours_per_week"}:
            raise BadValue
        table[name] = {"members": _as_names(entry["members"]), **_as_limits({name: limits})[name]}
        if "share" in entry:
            share = _as_float(entry["share"])
            if not share > 0:
                raise BadValue
            table[name]["share"] = share
    return table


def parse_capability(text: Any) -> tuple[int, int]:
    """`8.0`, `"8.6"`, `[8, 6]` -> (8, 6); raises UserError naming the value."""
    if isinstance(text, (list, tuple)) and len(text) == 2:
        try:
            return (_as_int(text[0]), _as_int(text[1]))
        except BadValue:
            pass
    elif isinstance(text, (str, int, float)) and not isinstance(text, bool):
        match = re.match(r"^\s*(\d+)(?:\.(\d+))?\s*$", str(text))
        if match:
            return (int(match.group(1)), int(match.group(2) or 0))
    raise UserError(f"invalid compute capability {text!r}: expected MAJOR.MINOR, e.g. 8.0")


def _as_capability(value: Any) -> tuple[int, int]:
    try:
        return parse_capability(value)
    except UserError:
        raise BadValue from None


# NVIDIA's MIG profile names: GPU instances "1g.10gb", "3g.40gb", "1g.10gb+me", and
# compute instances inside one, "1c.3g.40gb".
_PROFILE = re.compile(r"(\d+c\.)?\d+g\.\d+gb(\+me)?")


def _as_profile(value: Any) -> str:
    text = _as_str(value).strip().lower()
    if not _PROFILE.fullmatch(text):
        raise BadValue
    return text


def _as_path(value: Any) -> str:
    return os.path.expanduser(_as_str(value))


def _as_listen(value: Any) -> str:
    from gpuwarden.base.units import parse_listen

    text = _as_str(value)
    try:
        parse_listen(text)  # the servers read it the same way when they start
    except UserError:
        raise BadValue from None
    return text


# kind -> (normaliser, how to name the expected type in an error)
KINDS: dict[str, tuple[Callable[[Any], Any], str]] = {
    "str": (_as_str, "a string"),
    "bool": (_as_bool, "true or false"),
    "int": (_as_int, "an integer"),
    "float": (_as_float, "a number"),
    "seconds": (_as_seconds, "a number of seconds (ten years at most)"),
    "percent": (_as_percent, "a percentage 0-100"),
    "size": (_as_size, "a size such as 20GiB or 500M (1EiB at most)"),
    "duration": (_as_duration, "a duration such as 90, 30s, 5m or 4h (ten years at most)"),
    "ids": (_as_ids, 'GPU IDs such as "0,2" or ["GPU-3f2a"]'),
    "ints": (_as_ints, "a list of integers"),
    "capability": (_as_capability, "a compute capability such as 8.0"),
    "profile": (_as_profile, "a MIG profile such as 1g.10gb or 3g.40gb"),
    "path": (_as_path, "a path (string)"),
    "listen": (_as_listen, "HOST:PORT, :PORT or PORT"),
    "choice": (_as_str, "one of"),
    "names": (_as_names, 'names such as ["alice", "@gpuadmins"]'),
    "shares": (_as_shares, "a table of positive numbers such as {alice = 2, bob = 1}"),
    "limits": (
        _as_limits,
        "a table of users and @groups, each with positive max_gpus, max_jobs, max_time, "
        "max_interactive_time or "
        'gpu_hours_per_week, such as {"@students" = {max_gpus = 2, max_time = "1d"}}',
    ),
    "accounts": (
        _as_accounts,
        "a table of accounts, each with its members (users and @groups) and optional "
        "share, max_gpus, max_jobs, max_time, gpu_hours_per_week, "
        'such as {vision = {members = ["@lab"], share = 2}}',
    ),
}
