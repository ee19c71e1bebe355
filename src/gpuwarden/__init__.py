"""gpuwarden: pick, reserve, watch and diagnose NVIDIA GPUs on shared machines.

The package root stays import-cheap because `gpuwarden run` wraps every
training command: the Python API (`lease`, `select`) is resolved lazily.
"""

TYPE_CHECKING = False  # typing stays off the start-up path; annotations need it only here
if TYPE_CHECKING:
    from typing import Any


__version__ = "0.1.0"

__all__ = ["__version__", "lease", "select"]


def __getattr__(name: str) -> "Any":
    # The API functions are named like no module (`leases`, `selection` are the
    # modules), so importing a submodule never rebinds these names.
    if name == "lease":
        from gpuwarden.jobs.api import hold

        return hold
    if name == "select":
        from gpuwarden.jobs.api import pick

        return pick
    raise AttributeError(f"module 'gpuwarden' has no attribute {name!r}")
