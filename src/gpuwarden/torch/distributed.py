"""`init_distributed()`: one call that works under every launcher, and on one process.

It reads the launcher (`environments.detect`), picks the backend (NCCL only for
CUDA on Linux; gloo for CPU, MPS and Windows, where NCCL does not exist), binds the
process to its local rank's device before the process group starts (so NCCL
never creates a context on cuda:0 for every rank), applies `GPUWARDEN_MEM_LIMIT`,
and tears the group down at exit (after importing what would otherwise keep the
group alive past that teardown: `_import_before_the_group`).

A single process (no launcher) gets no process group at all: there is nobody to
talk to, and not opening a TCP store keeps `python train.py` as simple as before.
"""

from __future__ import annotations

import atexit
import contextlib
import datetime
import os
from typing import TYPE_CHECKING, Any

from gpuwarden.base.errors import UserError
from gpuwarden.base.records import record
from gpuwarden.torch.devices import device as pick_device
from gpuwarden.torch.devices import is_windows
from gpuwarden.torch.environments import Launch, detect
from gpuwarden.torch.memory import apply_memory_limit

if TYPE_CHECKING:
    import torch


@record
class DistInfo:
    """Where this process stands in the job. Usable as a context manager that tears down."""

    rank: int
    local_rank: int
    world_size: int
    device: torch.device
    backend: str
    environment: str
    initialized: bool

    @property
    def is_main(self) -> bool:
        """Rank 0: the one process that should print, log and write files."""
        return self.rank == 0

    def __enter__(self) -> DistInfo:
        return self

    def __exit__(self, *exc: object) -> None:
        destroy(barrier=exc[0] is None)


def choose_backend(device_type: str, windows: bool = False) -> str:
    """Pure: nccl for CUDA on Linux, gloo everywhere else."""
    return "nccl" if device_type == "cuda" and not windows else "gloo"


def init_distributed(
    backend: str | None = None, timeout: float | None = None, *, launch: Launch | None = None
) -> DistInfo:
    """Join the job this process was launched into (or note that it is alone)."""
    import torch
    import torch.distributed as dist

    launch = detect() if launch is None else launch
    dev = pick_device(launch)
    chosen = backend or choose_backend(dev.type, is_windows())
    if dev.type == "cuda":
        torch.cuda.set_device(dev)
        apply_memory_limit(dev)
    if dist.is_available() and dist.is_initialized():
        return DistInfo(
            dist.get_rank(),
            launch.local_rank,
            dist.get_world_size(),
            dev,
            dist.get_backend(),
            launch.environment,
            True,
        )
    if not launch.distributed:
        return DistInfo(0, 0, 1, dev, chosen, launch.environment, False)
    if not dist.is_available():
        raise UserError("this torch has no torch.distributed; it cannot join a multi-process job")
    # env:// reads these; Slurm and MPI do not set them, so we do.
    os.environ["MASTER_ADDR"] = str(launch.master_addr)
    os.environ["MASTER_PORT"] = str(launch.master_port)
    kwargs: dict[str, Any] = {}
    if timeout is not None:
        kwargs["timeout"] = datetime.timedelta(seconds=timeout)
    _import_before_the_group()
    dist.init_process_group(
        chosen, init_method="env://", rank=launch.rank, world_size=launch.world_size, **kwargs
    )
    _leave_together_at_exit()
    return DistInfo(
        launch.rank, launch.local_rank, launch.world_size, dev, chosen, launch.environment, True
    )


def _import_before_the_group() -> None:
    """Import `torch.distributed.nn` while no process group exists.

    Its functions take `group=group.WORLD` as a default argument, which binds the
    process group that exists when the module is first imported. DDP imports it
    lazily, after the group was made; the defaults then hold the group for the life
    of the interpreter, `destroy_process_group()` cannot free it, and gloo's worker
    and TCP threads keep running into interpreter shutdown, where the group is
    finally destroyed while the interpreter goes away around it: the likely source of
    the occasional `terminate called without an active exception` from a rank whose
    training had finished. Imported first, the defaults are None (the default group,
    looked up at call time) and `destroy()` really ends the group and its threads.
    """
    with contextlib.suppress(ImportError):
        import torch.distributed.nn  # noqa: F401


_failed = False


def _leave_together_at_exit() -> None:
    """At exit, meet the other ranks before tearing down, unless this rank is failing.

    A rank that tears its connections down while a peer still talks to it can
    make gloo abort the peer; after an uncaught exception a barrier would only
    wait for peers that will never arrive, so then we leave at once.
    """
    import sys

    previous = sys.excepthook

    def note_failure(*exc: Any) -> None:
        global _failed
        _failed = True
        previous(*exc)

    sys.excepthook = note_failure
    atexit.register(lambda: destroy(barrier=not _failed))


def destroy(barrier: bool = False) -> None:
    """Leave the process group if there is one (safe to call twice, or with none)."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        if barrier:
            # A peer that is already gone leaves nothing to wait for.
            with contextlib.suppress(Exception):
                dist.barrier()
        dist.destroy_process_group()
