"""Load nvidia-ml-py's module without loading `ctypes.util` for it.

nvidia-ml-py's first lines include `from ctypes.util import find_library`, a
function it calls only on Windows; `ctypes.util` brings `subprocess`, `tempfile`,
`random` and `hashlib` with it, which every `gpuwarden run` and `status` would pay
for nothing (docs/performance.md has the measurement). While nvidia-ml-py's module
executes, and only then, `ctypes.util` is a stand-in whose `find_library` loads the
real module when called; afterwards the stand-in is taken out of `sys.modules`, so
any later `import ctypes.util` (by anyone) gets the real module.
"""

from __future__ import annotations

import sys
from types import ModuleType

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Callable, Optional, TypeVar

    T = TypeVar("T")


def find_library(name: str) -> Optional[str]:
    """`ctypes.util.find_library`, the real module loaded on the first call."""
    from ctypes.util import find_library as real

    return real(name)


def without_ctypes_util(load: Callable[[], T]) -> T:
    """`load()` (which executes nvidia-ml-py's module) with the stand-in in place."""
    if "ctypes.util" in sys.modules:  # loaded already: nothing to save
        return load()
    stand_in = ModuleType("ctypes.util", "stand-in while nvidia-ml-py loads (gpuwarden)")
    stand_in.find_library = find_library  # type: ignore[attr-defined]
    sys.modules["ctypes.util"] = stand_in
    try:
        return load()
    finally:
        if sys.modules.get("ctypes.util") is stand_in:
            del sys.modules["ctypes.util"]
        ctypes = sys.modules.get("ctypes")
        if ctypes is not None and getattr(ctypes, "util", None) is stand_in:
            del ctypes.util
