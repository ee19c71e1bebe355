"""Reading what a command prints for a shell to `eval`."""

from __future__ import annotations

import shlex


def exports(text: str) -> dict[str, str]:
    """`export NAME=value` lines (as `reserve` prints them) as {NAME: value}."""
    out = {}
    for line in text.splitlines():
        assert line.startswith("export ")
        name, _, value = line[len("export ") :].partition("=")
        out[name] = shlex.split(value)[0] if value else ""
    return out
