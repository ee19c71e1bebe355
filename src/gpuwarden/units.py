"""Memory sizes as people type them (`20GiB`, `500M`, `1.5T`) and as we print them.

Decimal and binary suffixes are both accepted because users copy figures from
`nvidia-smi` (MiB) and from spec sheets (GB) alike; a bare number is bytes.
"""

from __future__ import annotations

import re

from gpuwarden.errors import UserError

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


def parse_size(text: str) -> int:
    """Bytes in `text`; raises UserError naming the bad value and the accepted forms."""
    match = re.match(_SIZE, str(text))
    unit = match.group(2).lower() if match else None
    if match is None or unit not in _UNITS:
        raise UserError(
            f"invalid size {text!r}: expected a number with an optional unit "
            "K/M/G/T (decimal) or KiB/MiB/GiB/TiB (binary), e.g. 20GiB or 500M"
        )
    return int(float(match.group(1)) * _UNITS[unit])


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
