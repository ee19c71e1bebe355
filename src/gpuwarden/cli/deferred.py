"""Standard-library modules the command line loads only when they are really used.

Two imports sit on the way of every `gpuwarden run` without doing anything there:

- `inspect` (with ast, dis and tokenize, ~5 ms): `dataclasses` imports it at the
  top, but on Python 3.9-3.11 calls it only to write a docstring for a class
  that has none, and every gpuwarden record has one. (From 3.12 it reads every
  class's annotations through `inspect`, so there it loads with the first record.)
- `copy` (with weakref, ~1 ms): `dataclasses` imports it too, for `asdict()`,
  which `run` never calls.
- `ctypes.util` (with subprocess, tempfile, random and hashlib, ~3 ms):
  nvidia-ml-py imports `find_library` from it and calls it only on Windows.

Each is replaced in `sys.modules` by a stand-in module that loads the real one
the first time any of its attributes is asked for, then answers from it, so
whoever uses the module gets the real one, only later. The standard library's
`importlib.util.LazyLoader` cannot do this here: a second `import inspect` reads
the module's `__spec__`, which makes it load at once. `from ctypes.util import
find_library` takes the attribute while importing, so the stand-in offers that
one name as a function that loads the real module when called.

Only the command line's entry point calls `install()`: a program that imports
gpuwarden as a library keeps its own import system untouched.
"""

from __future__ import annotations

import sys
from types import ModuleType

TYPE_CHECKING = False  # typing costs ~2.5 ms to import; annotations need it only here
if TYPE_CHECKING:
    from typing import Any


# module -> functions that importers take by name (`from m import f`) at import time
DEFERRED: dict[str, tuple[str, ...]] = {
    "inspect": (),
    "copy": (),
    "ctypes.util": ("find_library",),
}


def install() -> None:
    """Defer the modules above, unless something has imported them already."""
    for name, functions in DEFERRED.items():
        if name in sys.modules:
            continue
        stand_in = _StandIn(name)
        for function in functions:
            setattr(stand_in, function, _deferred_function(name, function))
        sys.modules[name] = stand_in
        package, _, leaf = name.rpartition(".")
        if package:  # `import ctypes.util; ctypes.util.x` looks on the package
            setattr(
                sys.modules[package] if package in sys.modules else _import(package), leaf, stand_in
            )


def _import(name: str) -> ModuleType:
    import importlib

    return importlib.import_module(name)


def _real(name: str) -> ModuleType:
    """Swap the stand-in for the real module (the import system then also sets it as
    its package's attribute) and return it."""
    if isinstance(sys.modules.get(name), _StandIn):
        del sys.modules[name]
    return _import(name)


def _deferred_function(module: str, function: str) -> Any:
    def call(*args: Any, **kwargs: Any) -> Any:
        return getattr(_real(module), function)(*args, **kwargs)

    call.__name__ = call.__qualname__ = function
    return call


class _StandIn(ModuleType):
    """Answers every attribute from the real module, loaded on first use."""

    def __getattr__(self, attr: str) -> Any:
        if attr == "__path__":  # asked by every `from m import f`: these are not packages
            raise AttributeError(attr)
        return getattr(_real(self.__name__), attr)
