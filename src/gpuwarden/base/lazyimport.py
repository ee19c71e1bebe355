"""Importing `dataclasses` without what it loads and gpuwarden never uses.

On Python 3.10 and 3.11 `dataclasses` imports `inspect` (with `ast`, `dis`,
`tokenize`) and `copy` at the top, but calls them only for a class without a
docstring (`inspect.signature`, for the generated one) and in
`asdict`/`astuple`/`replace` of nested values (`copy.deepcopy`). Every
`gpuwarden run` imports `dataclasses` (through `records`) and would pay for both
(docs/performance.md). While `dataclasses` executes, and only then, those two
names are stand-ins that import the real module on first use and put it in
`dataclasses`' globals; afterwards they are taken out of `sys.modules`, so any
later `import inspect` (by anyone) gets the real module. A stand-in touched while
it is still in `sys.modules` steps aside before importing the real module, so it
never finds itself. From Python 3.12 `dataclasses` uses `inspect` for every
class: nothing is saved there, and nothing is done.

Expiry: this module goes when Python 3.11 leaves the supported versions
(pyproject.toml; its upstream end of life is October 2027).
"""

from __future__ import annotations

import sys
from types import ModuleType

DEFERRED = ("inspect", "copy")


class _OnFirstUse(ModuleType):
    """Stands in for a module inside `dataclasses` until an attribute is read."""

    def __getattr__(self, attr: str) -> object:
        name = self.__name__
        if sys.modules.get(name) is self:  # read inside the import window: step aside first
            del sys.modules[name]
        __import__(name)
        real = sys.modules[name]
        owner = sys.modules.get("dataclasses")
        if owner is not None and getattr(owner, name, None) is self:
            setattr(owner, name, real)
        return getattr(real, attr)


def import_dataclasses() -> ModuleType:
    """The `dataclasses` module, imported with `inspect` and `copy` deferred when that
    saves anything (see the module docstring)."""
    if "dataclasses" in sys.modules or sys.version_info >= (3, 12):
        import dataclasses

        return dataclasses
    stand_ins = {}
    for name in DEFERRED:
        if name not in sys.modules:
            stand_ins[name] = sys.modules[name] = _OnFirstUse(name, "stand-in (gpuwarden)")
    try:
        import dataclasses
    finally:
        for name, stand_in in stand_ins.items():
            if sys.modules.get(name) is stand_in:
                del sys.modules[name]
    return dataclasses
