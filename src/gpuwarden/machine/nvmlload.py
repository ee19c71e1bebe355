"""Load nvidia-ml-py's module without the two standard modules it imports and barely uses.

nvidia-ml-py's first lines include `from ctypes.util import find_library`, a
function it calls only on Windows; `ctypes.util` brings `subprocess`, `tempfile`,
`random` and `hashlib` with it. They also `import threading`, for one
`threading.Lock()` made while the module executes: the lock `_thread.allocate_lock`
makes, which is what `threading.Lock()` returns; `threading` itself makes its
classes, its main-thread object and its at-fork hooks. Every `gpuwarden run` and
`status` would pay for both and use neither (docs/performance.md has the figures).

While nvidia-ml-py's module executes, and only then, each is a stand-in: the
`ctypes.util` one has a `find_library` that loads the real module when called,
the `threading` one has `Lock` (`_thread.allocate_lock`) and hands any other name
to the real module, loaded when first asked.
Afterwards the stand-ins leave `sys.modules`, so any later import (by anyone)
gets the real modules; one already loaded is used as it is. A stand-in asked for
anything else while nvidia-ml-py executes steps aside before loading the real
module, so it never finds itself.

Expiry: written for nvidia-ml-py 12 and 13 (pyproject.toml bounds it below 14);
the next major version is read again before the bound moves, and this module goes
as soon as nvidia-ml-py stops importing either module at its top. The `threading`
stand-in is never placed from Python 3.14, whose `ctypes` imports `threading`
(through `sysconfig`) before nvidia-ml-py runs: it goes when 3.14 is the oldest
Python supported.
"""

from __future__ import annotations

import sys
from types import ModuleType

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any, Optional, TypeVar

    T = TypeVar("T")


def find_library(name: str) -> Optional[str]:
    """`ctypes.util.find_library`, the real module loaded on the first call."""
    from ctypes.util import find_library as real

    return real(name)


def _real_threading(name: str) -> Any:
    """Any `threading` name but `Lock`, from the real module (loaded now; the stand-in
    leaves `sys.modules` first if nvidia-ml-py's module asks while it executes)."""
    if getattr(sys.modules.get("threading"), "gpuwarden_stand_in", False):
        del sys.modules["threading"]
    import threading

    return getattr(threading, name)


def _stand_ins() -> dict[str, ModuleType]:
    import _thread

    util = ModuleType("ctypes.util", "stand-in while nvidia-ml-py loads (gpuwarden)")
    util.find_library = find_library  # type: ignore[attr-defined]
    threading = ModuleType("threading", "stand-in while nvidia-ml-py loads (gpuwarden)")
    threading.Lock = _thread.allocate_lock  # type: ignore[attr-defined]
    threading.__getattr__ = _real_threading  # type: ignore[method-assign]
    threading.gpuwarden_stand_in = True  # type: ignore[attr-defined]
    return {"ctypes.util": util, "threading": threading}


def without_unused_modules(load: Callable[[], T]) -> T:
    """`load()` (which executes nvidia-ml-py's module) with the stand-ins in place of the
    modules not loaded yet."""
    placed = {name: module for name, module in _stand_ins().items() if name not in sys.modules}
    sys.modules.update(placed)
    try:
        return load()
    finally:
        for name, stand_in in placed.items():
            if sys.modules.get(name) is stand_in:
                del sys.modules[name]
        util, ctypes = placed.get("ctypes.util"), sys.modules.get("ctypes")
        if util is not None and ctypes is not None and getattr(ctypes, "util", None) is util:
            del ctypes.util  # the import bound the stand-in to its package too
