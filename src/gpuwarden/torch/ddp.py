"""Wrap a model for DistributedDataParallel on this process's device.

`nn.DataParallel` is deliberately not offered: it is one process driving every GPU
from Python threads, so the GIL, a scatter/gather through cuda:0 and a replica
copy every step make it slower than DDP even on one machine, and PyTorch itself
recommends DDP instead. DDP (one process per GPU) is also the only form that
grows to several nodes.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

    from gpuwarden.torch.distributed import DistInfo


def wrap(model: torch.nn.Module, info: DistInfo | None = None, **ddp_options: Any) -> Any:
    """Move `model` to the device; wrap it in DDP when a process group is running."""
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    from gpuwarden.torch.devices import device as pick_device

    dev = info.device if info is not None else pick_device()
    model = model.to(dev)
    if not (dist.is_available() and dist.is_initialized()):
        return model
    if dev.type == "cuda":
        ddp_options.setdefault("device_ids", [dev.index])
        ddp_options.setdefault("output_device", dev.index)
    return DistributedDataParallel(model, **ddp_options)


def unwrap(model: Any) -> torch.nn.Module:
    """The plain module inside a DDP wrapper, for saving and evaluation."""
    return getattr(model, "module", model)
