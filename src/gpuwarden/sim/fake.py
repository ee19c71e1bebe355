"""Build the fake `pynvml`: a private copy of nvidia-ml-py's module on a fake library.

The copy is nvidia-ml-py's own source, loaded a second time under another name,
so its constants, ctypes structs, `NVMLError_*` classes and wrapper functions are
exactly the installed version's. Only `_LoadNvmlLibrary` is replaced: instead of
`CDLL("libnvidia-ml.so.1")` it installs `FakeLibrary` (or, for a spec without a
driver, fails with NVML_ERROR_LIBRARY_NOT_FOUND as the real one does when the
shared object is missing).

Two attributes exist only on the fake, and say so in their names:
`gpuwarden_sim_spec` (the spec's name) and `gpuwarden_sim_processes()` (pid ->
(user, command) for the simulated processes, which have no real /proc entry).
"""

from __future__ import annotations

import _thread
import os
import sys
from importlib.machinery import ModuleSpec, SourceFileLoader
from types import ModuleType

from gpuwarden.machine.nvmlload import without_unused_modules

TYPE_CHECKING = False  # typing stays off the start-up path; annotations need it only here
if TYPE_CHECKING:
    from typing import Optional

    from gpuwarden.sim.specs import Spec

# A string: pathlib stays off the way of every simulated NVML client.
SHIM_DIR = os.path.join(os.path.dirname(os.path.realpath(__file__)), "shim")
_MODULES: dict[tuple[str, str], ModuleType] = {}
# _thread's lock (what threading.Lock() returns): threading stays off the way of every
# simulated NVML client, as gpuwarden.machine.nvmlload keeps it off nvidia-ml-py's.
_MODULES_LOCK = _thread.allocate_lock()


def real_pynvml_path() -> str:
    """nvidia-ml-py's pynvml.py on sys.path, skipping our own shim and any other
    gpuwarden's (a shell set up by `gpuwarden sim env` of an older checkout or venv
    keeps that one on PYTHONPATH): loading a shim as nvidia-ml-py would wait for ever
    on this module's lock."""
    for entry in sys.path:
        base = os.path.realpath(entry or os.getcwd())
        if _is_shim(base):
            continue
        candidate = os.path.join(base, "pynvml.py")
        if os.path.isfile(candidate):
            return candidate
    raise ImportError("nvidia-ml-py is not installed (no pynvml.py outside the gpuwarden shim)")


def _is_shim(directory: str) -> bool:
    """Whether `directory` is a gpuwarden's shim (this one's, SHIM_DIR, or another's):
    `gpuwarden/sim/shim`, beside its fake."""
    parent = os.path.dirname(directory)
    return os.path.basename(directory) == "shim" and os.path.isfile(os.path.join(parent, "fake.py"))


def load_copy(name: str) -> ModuleType:
    """A fresh copy of nvidia-ml-py's module registered as `name` in sys.modules
    (its error-class set-up looks itself up there)."""
    # importlib.machinery, not importlib.util: on Python 3.9 the latter imports
    # typing, and every simulated NVML client comes this way.
    path = real_pynvml_path()
    loader = SourceFileLoader(name, path)
    module = ModuleType(name)
    module.__file__ = path
    module.__loader__ = loader
    module.__spec__ = ModuleSpec(name, loader, origin=path)
    module.__spec__.has_location = True
    sys.modules[name] = module
    # From nvidia-ml-py's cached bytecode, as an import would; without ctypes.util
    # and threading.
    without_unused_modules(lambda: loader.exec_module(module))
    return module


def module(spec_name: Optional[str] = None, state_dir: Optional[str] = None) -> ModuleType:
    """The fake pynvml for `spec_name` (default: $GPUWARDEN_SIM); one per spec and process,
    so every importer shares the NVML init count and event sets, as with one real library."""
    from gpuwarden.base.errors import UserError
    from gpuwarden.sim import specs

    name = spec_name or os.environ.get("GPUWARDEN_SIM")
    if not name:
        raise UserError("no simulated machine: set GPUWARDEN_SIM to a spec name or path")
    spec = specs.load(name, state_dir)
    # Keyed by the state file, so a process that changes GPUWARDEN_SIM_STATE (a test
    # suite) gets a fresh library rather than one reading another machine's file.
    key = (spec.path, specs.state_file(spec, state_dir))
    with _MODULES_LOCK:  # two threads must not build two copies (and lose error classes)
        if key not in _MODULES:
            _MODULES[key] = _build(spec, state_dir)
        return _MODULES[key]


def _build(spec: Spec, state_dir: Optional[str]) -> ModuleType:
    from gpuwarden.sim.library import FakeLibrary, process_table

    nv = load_copy(f"gpuwarden.sim._pynvml_{len(_MODULES)}")
    library = FakeLibrary(spec, nv, state_dir)

    def _LoadNvmlLibrary() -> None:
        if nv.nvmlLib is None:
            if not library.file.read().get("driver", True):
                nv._nvmlCheckReturn(nv.NVML_ERROR_LIBRARY_NOT_FOUND)
            nv.nvmlLib = library

    nv._LoadNvmlLibrary = _LoadNvmlLibrary
    nv.gpuwarden_sim_spec = spec.name
    nv.gpuwarden_sim_library = library
    nv.gpuwarden_sim_processes = lambda: process_table(library.file.read())
    return nv
