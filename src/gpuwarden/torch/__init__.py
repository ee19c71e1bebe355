"""PyTorch helpers that make the careful way the default way.

    from gpuwarden.torch import init_distributed, wrap, precision, AmpStep, accumulate, Checkpointer

`device()`, `use_gpus()`, `init_distributed()`, `precision()`, `AmpStep`,
`accumulate()`, `Checkpointer`, `wrap()`: see docs/torch.md. This package is the
only part of gpuwarden that imports torch, and it does so lazily: importing it
costs next to nothing beyond `import torch`, and `use_gpus()` works before torch
is imported at all.
"""

from __future__ import annotations

from importlib import import_module
from typing import Any

_EXPORTS = {
    "device": "devices",
    "use_gpus": "visibility",
    "hide_gpus": "visibility",
    "apply_memory_limit": "memory",
    "init_distributed": "distributed",
    "destroy": "distributed",
    "DistInfo": "distributed",
    "detect": "environments",
    "Launch": "environments",
    "precision": "amp",
    "Precision": "amp",
    "AmpStep": "amp",
    "accumulate": "accumulation",
    "Checkpointer": "checkpoint",
    "wrap": "ddp",
    "unwrap": "ddp",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'gpuwarden.torch' has no attribute {name!r}")
    value = getattr(import_module(f"gpuwarden.torch.{module}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return __all__
