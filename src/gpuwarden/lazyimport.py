"""Importing `dataclasses` and `argparse` without what they load and gpuwarden never uses.

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

`argparse` takes `gettext` and `ngettext` from `gettext` to translate its own
words ("usage:", "options", its error messages) through the message catalogs of
the process's domain. gpuwarden ships no catalog and speaks English only, yet
every parser built looked the catalogs up again, importing `gettext` and `locale`
on the way (about 2 ms of every command). While `argparse` executes, `gettext` is
a stand-in whose two functions return the English text (as gettext's own
`NullTranslations` does) and which hands any other name to the real module; it
leaves `sys.modules` right after, so `import gettext` elsewhere gets the real one.

Expiry: the `dataclasses` part goes when Python 3.11 leaves the supported versions
(pyproject.toml; its upstream end of life is October 2027). The `argparse` part is
read again for each Python version added to pyproject.toml, and goes when
`argparse` no longer imports `gettext` when it loads (true of 3.10 to 3.13).
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


def _real_gettext(name: str) -> object:
    """Any `gettext` name but the two argparse takes, from the real module (the stand-in
    steps out of `sys.modules` first, so it never finds itself). The import system's own
    questions (`__path__` for `from gettext import ...`) are answered as a plain module's."""
    if name.startswith("__"):
        raise AttributeError(name)
    if getattr(sys.modules.get("gettext"), "gpuwarden_stand_in", False):
        del sys.modules["gettext"]
    import gettext

    return getattr(gettext, name)


def gettext_stand_in() -> ModuleType:
    """`gettext` while `argparse` imports it: the text as written (NullTranslations')."""
    stand_in = ModuleType("gettext", "stand-in while argparse loads (gpuwarden)")
    stand_in.gettext = lambda message: message  # type: ignore[attr-defined]
    stand_in.ngettext = lambda one, many, n: one if n == 1 else many  # type: ignore[attr-defined]
    stand_in.__getattr__ = _real_gettext  # type: ignore[method-assign]
    stand_in.gpuwarden_stand_in = True  # type: ignore[attr-defined]
    return stand_in


def import_argparse() -> ModuleType:
    """The `argparse` module, imported with its own words untranslated when it is not
    loaded yet (see the module docstring)."""
    if "argparse" in sys.modules or "gettext" in sys.modules:
        import argparse

        return argparse
    stand_in = sys.modules["gettext"] = gettext_stand_in()
    try:
        import argparse
    finally:
        if sys.modules.get("gettext") is stand_in:
            del sys.modules["gettext"]
    return argparse
