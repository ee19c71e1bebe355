"""A GPU request on the wire and in the queue's journal: `request.Request`, written
out (`to_wire`) and read back, every field checked (`from_wire`), here and nowhere
else.

    {"count": 2, "gpus": ["6", "7"], "exclude": [], "model": "A100", "min_capability": [8, 0],
     "min_free": 21474836480, "max_util": 10.0, "mem": null, "mig": null}

A client sends it in a `submit` (`run` through the service, `submit`, `reserve`,
`gpuwarden.lease()`, a kernel, submitit); the service keeps it as sent in the job's
record and reads it back to place the job (service.placing) and to judge whether it
could ever run (service.admission). A waiter in the line for this machine's GPUs
writes it in its ticket, which the others read back (leases.waitline). `count` is
sent resolved ("every GPU named", or 1); fields left at their defaults are left
out. The one field a client does not send, `keep_first_last`, is the service's to
decide (a ticket keeps it beside the request).
"""

from __future__ import annotations

from gpuwarden.base.checked import (
    MAX_BYTES,
    ProtocolError,
    checked_int,
    checked_number,
    checked_string,
    checked_strings,
    optional,
)
from gpuwarden.placement.request import Request

TYPE_CHECKING = False  # typing stays off a client's start-up path
if TYPE_CHECKING:
    from typing import Optional, Union

    Wire = dict[str, Union[int, float, str, list[str], list[int]]]

#: The fields on the wire, as `request.Request` names them.
FIELDS = (
    *("count", "gpus", "exclude", "model", "min_capability"),
    *("min_free", "max_util", "mem", "mig"),
)


def to_wire(request: Request) -> Wire:
    """`request` as the wire carries it: JSON values, defaults left out."""
    wire: Wire = {"count": request.gpu_count}
    if request.gpus:
        wire["gpus"] = list(request.gpus)
    if request.exclude:
        wire["exclude"] = list(request.exclude)
    if request.min_capability is not None:
        wire["min_capability"] = list(request.min_capability)
    for name in ("model", "min_free", "max_util", "mem", "mig"):
        value = getattr(request, name)
        if value is not None:
            wire[name] = value
    return wire


def from_wire(value: object, others: bool = False) -> Request:
    """The request a client sent (None: one GPU), each field checked for type and range
    (ProtocolError naming the first that does not fit). `others`: other fields may be
    beside these (a job's record keeps its signal, retries and notifications there)."""
    if value is None:
        return Request(count=1)
    if not isinstance(value, dict):
        raise ProtocolError("request must be an object")
    if not others:
        unknown = set(value) - set(FIELDS)
        if unknown:
            raise ProtocolError(f"request has unknown fields: {', '.join(sorted(unknown))}")
    gpus = optional(value.get("gpus"), checked_strings, "request.gpus", 1024)
    if gpus is not None and (not gpus or not all(gpus)):
        raise ProtocolError("request.gpus names no GPU (an empty name); leave it out for any GPU")
    count = value.get("count")
    resolved = (
        len(gpus or ()) or 1 if count is None else checked_int(count, "request.count", 0, 1024)
    )
    return Request(
        count=resolved,
        gpus=gpus,
        exclude=checked_strings(value.get("exclude", []), "request.exclude", 1024),
        model=optional(value.get("model"), checked_string, "request.model", 200),
        min_capability=_capability(value.get("min_capability")),
        # 0, as `--min-free 0` and the setting allow, asks for nothing
        min_free=optional(value.get("min_free"), checked_int, "request.min_free", 0, MAX_BYTES),
        max_util=optional(value.get("max_util"), checked_number, "request.max_util", 0.0, 100.0),
        mem=optional(value.get("mem"), checked_int, "request.mem", 1, MAX_BYTES),
        mig=optional(value.get("mig"), _profile, "request.mig"),
    )


def _capability(value: object) -> Optional[tuple[int, int]]:
    if value is None:
        return None
    if not isinstance(value, list) or len(value) != 2:
        raise ProtocolError("request.min_capability must be [major, minor]")
    return (
        checked_int(value[0], "request.min_capability major", 0, 100),
        checked_int(value[1], "request.min_capability minor", 0, 100),
    )


def _profile(value: object, what: str) -> str:
    from gpuwarden.config.values import KINDS, BadValue

    try:
        return str(KINDS["profile"][0](value))
    except BadValue:
        raise ProtocolError(f"{what} must be a MIG profile such as 1g.10gb") from None
