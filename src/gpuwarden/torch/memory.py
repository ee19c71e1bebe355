"""`GPUWARDEN_MEM_LIMIT`: keep a job on a shared GPU within the memory it declared.

`gpuwarden run --mem 20G` shares a GPU and exports the declared bytes; the
caching allocator enforces them once `set_per_process_memory_fraction` is set,
so an over-eager job fails with its own out-of-memory error instead of the
neighbour's.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import TYPE_CHECKING

from gpuwarden.base.errors import UserError

if TYPE_CHECKING:
    import torch

ENV = "GPUWARDEN_MEM_LIMIT"


def limit_bytes(environ: Mapping[str, str] | None = None) -> int | None:
    """The declared limit in bytes (a size like `20GiB` is accepted too), or None."""
    raw = (os.environ if environ is None else environ).get(ENV, "").strip()
    if not raw:
        return None
    from gpuwarden.base.units import parse_size  # only when a limit is set

    try:
        value = parse_size(raw)
    except UserError as err:
        raise UserError(f"{ENV}: {err}") from None
    if value <= 0:
        raise UserError(f"{ENV}={raw!r}: a memory limit must be more than 0 bytes")
    return value


def fraction(limit: int, total: int) -> float:
    """The allocator fraction for `limit` bytes of a `total`-byte GPU (at most 1)."""
    if total <= 0:
        raise UserError(f"cannot apply {ENV}: the GPU reports {total} bytes of memory")
    return min(1.0, limit / total)


def apply_memory_limit(dev: torch.device | None = None) -> float | None:
    """Apply `GPUWARDEN_MEM_LIMIT` to a CUDA device; returns the fraction, None if not applied.

    This starts CUDA on `dev`, so it is called where CUDA is about to be used
    anyway (`init_distributed()`), not from `device()`.
    """
    import torch

    limit = limit_bytes()
    if limit is None or dev is None or dev.type != "cuda":
        return None
    total = torch.cuda.get_device_properties(dev).total_memory
    share = fraction(limit, total)
    torch.cuda.set_per_process_memory_fraction(share, dev)
    return share
