"""Choose GPUs from inside a script: `use_gpus([2, 3])` or `hide_gpus()`.

`CUDA_VISIBLE_DEVICES` is read once, when the CUDA driver starts (`cuInit`). The
folklore "set it before `import torch`" is stricter than needed: torch starts
CUDA lazily, so setting it after the import works as long as nothing has touched
CUDA yet. Two things can have: torch's own initialisation (`torch.cuda.is_initialized()`)
and a bare `torch.cuda.is_available()`, which runs `cuInit` without marking torch
initialised. Both are checked; when either happened the variable would be ignored
silently, so we refuse loudly instead.

Indices are nvidia-smi's (PCI bus order): `CUDA_DEVICE_ORDER=PCI_BUS_ID` is set
with them, because CUDA's default order (fastest first) can differ.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable

from gpuwarden.base.errors import UserError
from gpuwarden.base.units import is_digits

_CUDA_NOT_INITIALIZED = 3  # CUresult CUDA_ERROR_NOT_INITIALIZED
# torch.cuda functions that have cached a device count in some torch release
# (2.1-2.3 wrapped device_count and the NVML helpers in functools.lru_cache).
_CACHED = ("device_count", "_device_count_nvml", "_raw_device_count_nvml", "_raw_device_uuid_nvml")


def use_gpus(ids: Iterable[int | str]) -> str:
    """Expose only these GPUs (nvidia-smi indices or UUIDs) to CUDA in this process."""
    items = [str(i).strip() for i in ids]
    for item in items:
        if not (is_digits(item) or item.startswith(("GPU-", "MIG-"))):
            raise UserError(f"use_gpus: {item!r} is neither a GPU index nor a GPU/MIG UUID")
    if len(set(items)) != len(items):
        raise UserError(f"use_gpus: {','.join(items)} names a GPU twice")
    value = ",".join(items)
    _set(value)
    return value


def hide_gpus() -> None:
    """Make this process see no GPU at all (CPU-only runs on a GPU machine)."""
    _set("")


def _set(value: str) -> None:
    refuse_if_started(value)
    os.environ["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
    os.environ["CUDA_VISIBLE_DEVICES"] = value
    forget_device_counts()


def refuse_if_started(value: str) -> None:
    """Raise if CUDA already read CUDA_VISIBLE_DEVICES, so the new value would be ignored."""
    current = os.environ.get("CUDA_VISIBLE_DEVICES")
    torch = sys.modules.get("torch")
    started = None
    if torch is not None and torch.cuda.is_initialized():
        started = "torch has already initialised CUDA"
    elif driver_started():
        started = "the CUDA driver was already started (e.g. by torch.cuda.is_available())"
    if started and current != value:
        raise UserError(
            f"cannot set CUDA_VISIBLE_DEVICES={value!r}: {started} with "
            f"CUDA_VISIBLE_DEVICES={current!r}, and CUDA reads it only once; call "
            "use_gpus()/hide_gpus() before anything touches CUDA, or set it outside: "
            f"`CUDA_VISIBLE_DEVICES={value} python ...` or `gpuwarden run -g N -- python ...`"
        )


def driver_started() -> bool:
    """Whether `cuInit` has run in this process; False where no CUDA driver is loaded.

    Only a driver that is already loaded is asked (dlopen with RTLD_NOLOAD), so the
    check neither loads libcuda nor starts it: before `cuInit`, `cuDeviceGetCount`
    answers CUDA_ERROR_NOT_INITIALIZED.
    """
    if not sys.platform.startswith("linux"):
        return False
    import ctypes

    try:
        lib = ctypes.CDLL("libcuda.so.1", mode=os.RTLD_NOLOAD | os.RTLD_LAZY)
    except OSError:
        return False
    count = ctypes.c_int(0)
    return lib.cuDeviceGetCount(ctypes.byref(count)) != _CUDA_NOT_INITIALIZED


def forget_device_counts() -> None:
    """Drop device counts torch cached before CUDA started, so they see the new value."""
    cuda = getattr(sys.modules.get("torch"), "cuda", None)
    if cuda is None or cuda.is_initialized():
        return
    for name in _CACHED:
        clear = getattr(getattr(cuda, name, None), "cache_clear", None)
        if clear is not None:
            clear()
    if getattr(cuda, "_cached_device_count", None) is not None:
        cuda._cached_device_count = None
