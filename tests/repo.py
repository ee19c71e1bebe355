"""Where this checkout is: tests run the sources beside them, never an installed copy.

`SRC` goes first on the PYTHONPATH of every process a test starts (`str(SRC)` in an
environment), so a subprocess runs the code under test.
"""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SRC = ROOT / "src"
