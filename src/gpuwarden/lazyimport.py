"""Importing `dataclasses` and `argparse` without what they load and gpuwarden never uses.

On Python 3.9-3.11 `dataclasses` imports `inspect` (with `ast`, `dis`, `tokenize`)
and `copy` at the top, but calls them only for a class without a docstring
(`inspect.signature`, for the generated one) and in `asdict`/`astuple`/`replace` of
nested values (`copy.deepcopy`). Every `gpuwarden run` imports `dataclasses` (through
`records`) and pays for them (docs/performance.md). While `dataclasses` executes, and
only then, those two names are stand-ins that import the real module on first use
and put it in `dataclasses`' globals; afterwards they are taken out of `sys.modules`,
so any later `import inspect` (by anyone) gets the real module, as `nvmlload` does
for `ctypes.util`. From Python 3.12 `dataclasses` uses `inspect` for every class:
nothing is saved there, and nothing is done.

`argparse` takes `gettext` and `ngettext` from `gettext` to translate its own words
("usage:", "options", its error messages) through the message catalogs of the
process's domain. gpuwarden ships no catalog and speaks English only, like the rest
of its output, yet every parser built (two for each command) looked the catalogs up
again, importing `gettext` and `locale` on the way, for every `gpuwarden run`
(docs/performance.md has the measurement).
While `argparse` executes, `gettext` is a stand-in whose two functions return the
English text (as gettext's own `NullTranslations` does); it leaves `sys.modules`
right after, so `import gettext` elsewhere gets the real module.
"""

from __future__ import annotations

import sys
from types import ModuleType

DEFERRED = ("inspect", "copy")


class _OnFirstUse(ModuleType):
    """Stands in for a module inside `dataclasses` until an attribute is read."""

    def __getattr__(self, attr: str) -> object:
        name = self.__name__
        __import__(name)  # the stand-in left sys.modules: this is the real import
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
            stand_ins[name] = sys.modules[name] = _OnFirstUse(name)
    try:
        import dataclasses
    finally:
        for name, stand_in in stand_ins.items():
            if sys.modules.get(name) is stand_in:
                del sys.modules[name]
    return dataclasses


class _English(ModuleType):
    """`gettext` while `argparse` imports it: the text as written (NullTranslations')."""

    @staticmethod
    def gettext(message: str) -> str:
        return message

    @staticmethod
    def ngettext(singular: str, plural: str, n: int) -> str:
        return singular if n == 1 else plural


def import_argparse() -> ModuleType:
    """The `argparse` module, imported with its own words untranslated when it is not
    loaded yet (see the module docstring)."""
    if "argparse" in sys.modules or "gettext" in sys.modules:
        import argparse

        return argparse
    stand_in = sys.modules["gettext"] = _English("gettext")
    try:
        import argparse
    finally:
        if sys.modules.get("gettext") is stand_in:
            del sys.modules["gettext"]
    return argparse
