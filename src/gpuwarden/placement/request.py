"""What a job asks of the GPUs: `Request`, the one request type every face builds
(`run`, `submit`, `reserve`, `gpuwarden.lease()`, a kernel, submitit) and the queue
service reads back (placement.requestwire is its form on the wire). A module of its
own, without the choosing (`selection`): a client that only passes a request on to the
service loads none of that.
"""

from __future__ import annotations

from gpuwarden.base.records import record

TYPE_CHECKING = False  # typing stays off the start-up path; annotations need it only here
if TYPE_CHECKING:
    from typing import Any, Optional


@record
class Request:
    """What a job asks for. `count` None means "every GPU in `gpus`", or 1 when `gpus`
    is not given; with both, `count` GPUs are picked among `gpus`. `mem` (bytes) asks
    for a share of a GPU instead of a whole one."""

    count: Optional[int] = None
    gpus: Optional[tuple[str, ...]] = None  # IDs: nvidia-smi indices or UUID prefixes
    min_free: Optional[int] = None  # bytes
    max_util: Optional[float] = None  # percent
    min_capability: Optional[tuple[int, int]] = None
    model: Optional[str] = None  # glob or substring, case-insensitive
    exclude: tuple[str, ...] = ()
    mem: Optional[int] = None  # bytes; None = exclusive
    keep_first_last: bool = True
    mig: Optional[str] = None  # a MIG profile ("1g.10gb"): only MIG slices of it

    @property
    def gpu_count(self) -> int:
        """How many GPUs the request names before the IDs are resolved: what decides,
        ahead of choosing, whether topology matters and how many whole GPUs a waiter
        needs."""
        if self.count is not None:
            return self.count
        return len(self.gpus or ()) or 1

    @classmethod
    def from_config(cls, config: Any, **overrides: Any) -> Request:
        """The request the `run.*` settings describe (see gpuwarden.config); keyword
        arguments (e.g. `mem=`) override."""
        fields = {
            "count": config.get("run.count"),
            "gpus": config.get("run.gpus") or None,
            "min_free": config.get("run.min_free"),
            "max_util": config.get("run.max_util"),
            "min_capability": config.get("run.min_capability"),
            "model": config.get("run.model"),
            "exclude": tuple(config.get("run.exclude") or ()),
            "keep_first_last": bool(config.get("run.keep_first_last")),
            "mig": config.get("run.mig"),
        }
        fields.update(overrides)
        return cls(**fields)
