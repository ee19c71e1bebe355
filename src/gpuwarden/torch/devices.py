"""Which `torch.device` this process should use, decided without starting CUDA.

The seeds' `torch.device("cuda:0" if torch.cuda.is_available() else "cpu")`
has two faults: `is_available()` runs `cuInit` in the parent process (so DataLoader
workers forked later inherit a started driver), and in a distributed run every
rank lands on `cuda:0`. Here the count comes from `torch.cuda.device_count()`,
which asks NVML and leaves CUDA untouched when NVML answers, and the index is the
launcher's local rank.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from typing import TYPE_CHECKING

from gpuwarden.base.errors import UserError
from gpuwarden.torch.environments import Launch, detect

if TYPE_CHECKING:
    import torch

    from gpuwarden.config import Config

CHOICES = ("auto", "cpu", "cuda", "mps")


def requested(environ: Mapping[str, str] | None = None, configured: str | None = None) -> str:
    """`GPUWARDEN_DEVICE`, else `configured` (the caller's reading of `torch.device`),
    else `auto`."""
    environ = os.environ if environ is None else environ
    value = environ.get("GPUWARDEN_DEVICE")
    source = "GPUWARDEN_DEVICE"
    if not value:
        value, source = configured, "config torch.device"
    value = (value or "auto").strip().lower()
    if value not in CHOICES:
        raise UserError(f"{source}={value!r}: choose one of {', '.join(CHOICES)}")
    return value


def pick_type(request: str, cuda_count: int, mps: bool) -> str:
    """Pure policy: the device type for a request, given what the machine has."""
    if request == "auto":
        return "cuda" if cuda_count > 0 else "mps" if mps else "cpu"
    if request == "cuda" and cuda_count == 0:
        raise UserError(
            "torch.device=cuda was asked for but no CUDA GPU is visible "
            "(check CUDA_VISIBLE_DEVICES, or use auto to fall back to CPU)"
        )
    if request == "mps" and not mps:
        raise UserError("torch.device=mps was asked for but this torch has no usable MPS")
    return request


def cuda_index(local_rank: int, count: int) -> int:
    """Local rank N uses cuda:N; a launcher that binds one GPU per task leaves cuda:0."""
    if count == 1:
        return 0
    if local_rank >= count:
        raise UserError(
            f"local rank {local_rank} has no GPU: only {count} are visible to this process; "
            "start one process per GPU (e.g. `gpuwarden run --ddp -g N`)"
        )
    return local_rank


def mps_available() -> bool:
    import torch

    backend = getattr(torch.backends, "mps", None)
    return bool(backend and backend.is_built() and backend.is_available())


def device(launch: Launch | None = None, conf: Config | None = None) -> torch.device:
    """The device for this process (see module docstring for how it is chosen);
    `conf`: the caller's reading of the configuration, else the one in force."""
    import torch

    configured = None
    if not os.environ.get("GPUWARDEN_DEVICE"):  # which `requested` takes first
        if conf is None:
            from gpuwarden import config

            conf = config.load()
        configured = conf.get("torch.device")
    request = requested(configured=None if configured is None else str(configured))
    count = torch.cuda.device_count() if request in ("auto", "cuda") else 0
    mps = request in ("auto", "mps") and count == 0 and mps_available()
    kind = pick_type(request, count, mps)
    if kind != "cuda":
        return torch.device(kind)
    launch = detect() if launch is None else launch
    return torch.device("cuda", cuda_index(launch.local_rank, count))


def is_windows() -> bool:
    return sys.platform.startswith("win")
