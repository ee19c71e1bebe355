"""A simulated GPU machine: a fake `libnvidia-ml` under nvidia-ml-py's own `pynvml` code.

`gpuwarden.sim.fake.module()` returns a private copy of nvidia-ml-py's `pynvml`
whose library is `gpuwarden.sim.library.FakeLibrary` instead of
`libnvidia-ml.so.1`: every wrapper, struct, constant and error class is the real
one, and only the C functions are simulated, driven by a TOML machine spec
(`gpuwarden.sim.specs`) and a shared state file (`gpuwarden.sim.state`).
`Machine` (`gpuwarden.sim.machine`) steers that state from any process.
"""

from __future__ import annotations

TYPE_CHECKING = False  # typing stays off the start-up path; annotations need it only here
if TYPE_CHECKING:
    from typing import Any


__all__ = ["Machine"]


def __getattr__(name: str) -> Any:
    if name == "Machine":
        from gpuwarden.sim.machine import Machine

        return Machine
    raise AttributeError(f"module 'gpuwarden.sim' has no attribute {name!r}")
