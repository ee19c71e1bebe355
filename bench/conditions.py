"""What every bench checks before it measures: that each command it times runs as a
user's would.

`PYTHONDONTWRITEBYTECODE=1` in the bench's environment reaches every command it
starts, and an editable install (or this tree's `src` on PYTHONPATH) then has no
bytecode to load: each command compiles every module it imports, tens of
milliseconds each time, and every figure is wrong. A bench refuses to run so and
names it; otherwise it compiles the tree once, so the first round pays no compile.
"""

from __future__ import annotations

import compileall
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def tree_root(tree: str) -> Path:
    """The root of a source tree given as its root or as its `src` (`--compare DIR`).
    A path holding neither would leave Python to import this virtual environment's
    own gpuwarden and report it as the other tree's figure."""
    for root in (Path(tree), Path(tree).parent):
        if (root / "src" / "gpuwarden" / "__init__.py").is_file():
            return root.resolve()
    raise SystemExit(f"--compare {tree}: no gpuwarden/ there or in its src/")


def bytecode(trees: tuple[Path, ...] = (ROOT,)) -> None:
    """Refuse a bench whose commands would compile their modules on every start;
    compile `trees`' sources now (each tree's `src`)."""
    if os.environ.get("PYTHONDONTWRITEBYTECODE"):
        raise SystemExit(
            "PYTHONDONTWRITEBYTECODE is set: every command this bench times would compile "
            "each gpuwarden module again (an editable install keeps no bytecode then), "
            "and every figure would be wrong; run it without: "
            f"env -u PYTHONDONTWRITEBYTECODE {' '.join([sys.executable, *sys.argv])}"
        )
    for tree in trees:
        src = tree / "src"
        if not compileall.compile_dir(str(src), quiet=1):
            raise SystemExit(f"cannot compile {src}: its commands would compile at every start")
