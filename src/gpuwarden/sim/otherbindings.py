"""The simulated library under NVML bindings other than nvidia-ml-py's: py3nvml, whose
`py3nvml.py3nvml` is a copy of old nvidia-ml-py code that loads libnvidia-ml.so.1 with
`CDLL` itself. Its `_LoadNvmlLibrary` is replaced as in `fake` (the same FakeLibrary
answers: it looks functions up by C name and fills the caller's own ctypes structs),
and the rest of the package runs as installed. The shim package
`gpuwarden/sim/shim/py3nvml` calls `stand_in` as `import py3nvml` runs.
"""

from __future__ import annotations

import importlib
import os
import sys
from typing import Any

from gpuwarden.sim.fake import _is_shim


def installed(package: str) -> str:
    """The installed package's `__init__.py` on sys.path, past every gpuwarden shim."""
    for entry in sys.path:
        base = os.path.realpath(entry or os.getcwd())
        if _is_shim(base):
            continue
        candidate = os.path.join(base, package, "__init__.py")
        if os.path.isfile(candidate):
            return candidate
    raise ImportError(f"{package} is not installed (none outside the gpuwarden shim)")


def stand_in(namespace: dict[str, Any]) -> None:
    """Make the shim package `namespace` the installed py3nvml: its submodules come from
    the installed directory, its `__init__` runs as written, and with GPUWARDEN_SIM the
    bindings answer from the simulated machine."""
    init = installed("py3nvml")
    namespace["__path__"] = [os.path.dirname(init)]
    namespace["__file__"] = init
    if os.environ.get("GPUWARDEN_SIM"):
        simulate(importlib.import_module(namespace["__name__"] + ".py3nvml"))
    with open(init, encoding="utf-8") as f:
        code = compile(f.read(), init, "exec")
    exec(code, namespace)


def simulate(bindings: Any) -> None:
    """`bindings` (a module of nvidia-ml-py's shape) loads the simulated library of
    $GPUWARDEN_SIM instead of libnvidia-ml.so.1."""
    from gpuwarden.sim import specs
    from gpuwarden.sim.library import FakeLibrary

    spec = specs.load(os.environ["GPUWARDEN_SIM"], None)
    library = FakeLibrary(spec, bindings, None)

    def _LoadNvmlLibrary() -> None:
        if bindings.nvmlLib is None:
            if not library.file.read().get("driver", True):
                bindings._nvmlCheckReturn(bindings.NVML_ERROR_LIBRARY_NOT_FOUND)
            bindings.nvmlLib = library

    bindings._LoadNvmlLibrary = _LoadNvmlLibrary
    bindings.gpuwarden_sim_spec = spec.name
