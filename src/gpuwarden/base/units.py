"""Memory sizes (`20GiB`, `500M`, `1.5T`), durations (`90`, `30m`, `4h`) and listening
addresses (`127.0.0.1:9400`, `:9400`, `9400`) as people type them, and sizes and
durations as we print them. The config keys, the command-line options and the
servers all parse through here, so one spelling means one thing everywhere.

Decimal and binary suffixes are both accepted because users copy figures from
`nvidia-smi` (MiB) and from spec sheets (GB) alike; a bare number is bytes.

Both parsers refuse values no machine can mean (sizes above 1 EiB, durations above
ten years) rather than passing them on: a huge figure overflows later arithmetic
(`reserve --for 99999999999d` once printed "until 17:12"), so it is refused here,
in one line that names the value.
"""

from __future__ import annotations

import re

from gpuwarden.base.errors import UserError

_UNITS = {
    "": 1,
    "b": 1,
    "k": 10**3,
    "kb": 10**3,
    "ki": 2**10,
    "kib": 2**10,
    "m": 10**6,
    "mb": 10**6,
    "mi": 2**20,
    "mib": 2**20,
    "g": 10**9,
    "gb": 10**9,
    "gi": 2**30,
    "gib": 2**30,
    "t": 10**12,
    "tb": 10**12,
    "ti": 2**40,
    "tib": 2**40,
}

# Compiled on first use (re keeps it): `status` and `run` import this module to format.
_SIZE = r"^\s*(\d+(?:\.\d+)?|\.\d+)\s*([a-zA-Z]*)\s*$"
MAX_SIZE = 2**60  # 1 EiB: more memory than any machine has, far below float trouble
MAX_DURATION = 10 * 365 * 86400.0  # ten years: longer is a typo, not a plan


def is_digits(text: str) -> bool:
    """Whether `text` is a whole number `int()` reads: ASCII digits, at least one.
    `str.isdigit` also says yes to "²" or "①", on which `int` raises."""
    return text.isascii() and text.isdigit()


def shown(value: object, limit: int = 40) -> str:
    """`repr(value)`, cut short: an error line stays one readable line whatever was typed."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 4] + "...'"


def parse_size(text: str) -> int:
    """Bytes in `text`; raises UserError naming the bad value and the accepted forms."""
    match = re.match(_SIZE, str(text))
    unit = match.group(2).lower() if match else None
    if match is None or unit not in _UNITS:
        raise UserError(
            f"invalid size {shown(text)}: expected a number with an optional unit "
            "K/M/G/T (decimal) or KiB/MiB/GiB/TiB (binary), e.g. 20GiB or 500M"
        )
    number = float(match.group(1)) * _UNITS[unit]  # huge digit strings give inf, not an error
    if not number <= MAX_SIZE:
        raise UserError(f"invalid size {shown(text)}: sizes above 1EiB are not accepted")
    return int(number)


_DURATION = r"^\s*(\d+(?:\.\d+)?|\.\d+)\s*(s|sec|m|min|h|d|)\s*$"
_DURATION_UNITS = {"": 1, "s": 1, "sec": 1, "m": 60, "min": 60, "h": 3600, "d": 86400}


def parse_duration(text: str | float) -> float:
    """Seconds in `text` (`90`, `30s`, `5m`, `4h`, `1d`, or a number of seconds);
    raises UserError naming the value when it is malformed, negative, not finite or
    longer than ten years."""
    if isinstance(text, (int, float)) and not isinstance(text, bool):
        seconds = float(text)
        if not 0 <= seconds <= MAX_DURATION:  # also NaN
            raise UserError(f"invalid duration {shown(text)}: expected 0 to ten years (in seconds)")
        return seconds
    match = re.match(_DURATION, str(text), re.IGNORECASE)
    if match is None:
        raise UserError(
            f"invalid duration {shown(text)}: "
            "expected seconds or a number with s/m/h/d, e.g. 30m or 4h"
        )
    seconds = float(match.group(1)) * _DURATION_UNITS[match.group(2).lower()]
    if not seconds <= MAX_DURATION:
        raise UserError(
            f"invalid duration {shown(text)}: durations above ten years are not accepted"
        )
    return seconds


#: Slurm's words for no time limit.
UNLIMITED = ("UNLIMITED", "INFINITE")


def is_slurm_time(text: str) -> bool:
    """Slurm's own --time forms: minutes, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS
    (ASCII digits only: see `is_digits`)."""
    days, dash, rest = text.partition("-")
    if dash and not is_digits(days):
        return False
    parts = (rest if dash else text).split(":")
    return len(parts) <= 3 and all(is_digits(p) for p in parts)


def parse_time_limit(text: str) -> float | None:
    """A job's `--time` in seconds, read as Slurm reads it so that `--time 90` means
    the same with the queue service as with `--slurm`: a bare number is minutes, then
    MM:SS, HH:MM:SS, D-HH, D-HH:MM and D-HH:MM:SS; gpuwarden's durations (90s, 30m,
    4h, 2d) too. None for no limit (0, UNLIMITED, INFINITE, as in Slurm; `0s` is
    refused as a slip). Raises UserError naming the value and the forms accepted."""
    value = str(text).strip()
    if value.upper() in UNLIMITED:
        return None
    if value and is_slurm_time(value):
        days, dash, rest = value.partition("-")
        fields = [int(f) for f in (rest if dash else value).split(":")]
        if dash:  # D-HH, D-HH:MM, D-HH:MM:SS
            hours, minutes, secs = [*fields, 0, 0][:3]
            seconds = float(int(days) * 86400 + hours * 3600 + minutes * 60 + secs)
        elif len(fields) == 1:  # minutes
            seconds = fields[0] * 60.0
        elif len(fields) == 2:  # MM:SS
            seconds = fields[0] * 60.0 + fields[1]
        else:  # HH:MM:SS
            seconds = fields[0] * 3600.0 + fields[1] * 60 + fields[2]
    else:
        try:
            seconds = parse_duration(value) if value[-1:].isalpha() else 0.0
        except UserError:
            seconds = 0.0
        if seconds <= 0:  # a duration of nothing is a slip; Slurm's "0" is read above
            raise UserError(
                f"invalid --time {shown(text)}: expected minutes, MM:SS, [D-]HH:MM:SS or "
                "a duration such as 90s, 30m, 4h, 2d"
            )
    if seconds > MAX_DURATION:
        raise UserError(
            f"invalid --time {shown(text)}: time limits above ten years are not accepted"
        )
    return seconds or None


LOOPBACK = "127.0.0.1"


def parse_listen(
    text: str, *, any_host: str = "0.0.0.0", any_port: bool = False
) -> tuple[str, int]:
    """(host, port) of a listening address: `HOST:PORT`, `[IPv6]:PORT`, `:PORT` (host
    `any_host`: every interface for the exporter, as Prometheus exporters read it) or a
    bare `PORT` (loopback: what is served may name users). Port 0 (any free port) only
    with `any_port`: a configured address must be one that clients can find."""
    value = str(text).strip()
    host, sep, port = value.rpartition(":")
    if not sep:
        host, port = LOOPBACK, value
    host = host.strip("[]") or any_host
    low = 0 if any_port else 1
    if not (port.isascii() and port.isdigit()) or not low <= int(port) <= 65535:
        raise UserError(
            f"invalid listen address {shown(text)}: expected HOST:PORT, :PORT or PORT, "
            "e.g. 127.0.0.1:9400"
        )
    return host, int(port)


def format_size(num_bytes: int | None) -> str:
    """Binary units, as nvidia-smi prints them (MiB below 10 GiB, GiB above)."""
    if num_bytes is None:
        return "n/a"
    if num_bytes >= 10 * 2**30:
        return f"{num_bytes / 2**30:.1f}GiB"
    if num_bytes >= 2**20:
        return f"{num_bytes / 2**20:.0f}MiB"
    if num_bytes >= 2**10:
        return f"{num_bytes / 2**10:.0f}KiB"
    return f"{num_bytes}B"


def format_span(seconds: float) -> str:
    """A duration as people read it: 42s, 5m07s, 3h20m."""
    seconds = round(seconds)
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"
