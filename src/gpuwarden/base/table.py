"""Plain-text tables for terminals: fixed columns, the last one free to run long.

No dependency (rich, tabulate) because every CLI command pays its import cost.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence


def columns(fallback: int = 80) -> int:
    """The terminal's width as `shutil.get_terminal_size` finds it ($COLUMNS, then
    stdout's terminal, then `fallback`), without importing shutil (with its
    compression modules) into commands that only need this number."""
    try:
        width = int(os.environ["COLUMNS"])
    except (KeyError, ValueError):
        width = 0
    if width > 0:
        return width
    try:
        return os.get_terminal_size(sys.__stdout__.fileno()).columns or fallback
    except (AttributeError, ValueError, OSError):  # no stdout, closed, or not a terminal
        return fallback


def render(headers: Sequence[str], rows: Sequence[Sequence[str]], right: Sequence[int] = ()) -> str:
    """Columns padded to their widest cell; indices in `right` are right-aligned.
    The last column is never padded, so long process lists do not widen the others."""
    widths = [len(h) for h in headers]
    for row in rows:
        for i, cell in enumerate(row[:-1]):
            widths[i] = max(widths[i], len(cell))
    lines = []
    for row in [list(headers), *rows]:
        cells = []
        for i, cell in enumerate(row):
            if i == len(row) - 1:
                cells.append(cell)
            elif i in right:
                cells.append(cell.rjust(widths[i]))
            else:
                cells.append(cell.ljust(widths[i]))
        lines.append("  ".join(cells).rstrip())
    return "\n".join(lines)
