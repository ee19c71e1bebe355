"""One lease record, `<uuid>.<job>.lease`: its name, its fields, and checking them.

The record is JSON written by the holder of a lease, in a directory every local
user may write, so a reader checks every field (type, range, agreement with the
file's name) before trusting any: a record that fails is never used as is (see
`gpuwarden.leases`, which then counts its GPU as taken while its lock is held).
Pure functions: nothing here touches a file.
"""

from __future__ import annotations

import json

from gpuwarden.base.records import record
from gpuwarden.files.safefiles import printable

TYPE_CHECKING = False  # typing stays off the start-up path; annotations need it only here
if TYPE_CHECKING:
    from typing import Optional

HOLDER_SUFFIX = ".lease"


@record
class LeaseInfo:
    """Who holds (part of) a GPU, as recorded beside the lock."""

    uuid: str
    user: str
    pid: int
    command: str
    started: float  # time.time()
    mem: Optional[int] = None  # declared bytes for a shared lease; None = exclusive
    job: Optional[str] = None  # job id / name
    expires: Optional[float] = None  # time.time() a reservation ends; None = with the job
    index: Optional[int] = None  # nvidia-smi index when the lease was taken (presentation)


_UUID = r"(?:GPU|MIG)-[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}"
_JOB = r"[A-Za-z0-9][A-Za-z0-9_-]{0,63}"
#: A holder file's name: (GPU UUID).(job).holder. A pattern, compiled (by `re`'s own
#: cache) only when a directory holds a lease to read: an idle machine's run skips it.
HOLDER_PATTERN = rf"({_UUID})\.({_JOB})\{HOLDER_SUFFIX}"


def _number(value: object, lo: float, hi: float) -> bool:
    """A JSON number (not a bool, not NaN) in [lo, hi]."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and lo <= value <= hi


def _integer(value: object, lo: int, hi: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and lo <= value <= hi


def parse_record(data: bytes, uuid: str, job: str, owner: str, by_root: bool = False) -> LeaseInfo:
    """The lease a metadata file records, every field checked (types, ranges, the uuid
    and job its name says); ValueError naming the first bad field. The user is the
    file's owner from the kernel, never a field — except in a record root wrote
    (`by_root`: the queue service leases for its jobs' owners), whose `user` field
    names the job's owner."""
    try:
        meta = json.loads(data)
    except (ValueError, RecursionError):
        raise ValueError("not JSON") from None
    if not isinstance(meta, dict):
        raise ValueError("not a JSON object")
    checks = {
        "uuid": meta.get("uuid") == uuid,
        "job": meta.get("job") == job,
        "pid": _integer(meta.get("pid"), 1, 2**31 - 1),
        "command": isinstance(meta.get("command", ""), str)
        and len(meta.get("command", "")) <= 4096,
        "started": _number(meta.get("started"), 0, 2**40),
        "mem": meta.get("mem") is None or _integer(meta.get("mem"), 1, 2**60),
        "expires": meta.get("expires") is None or _number(meta.get("expires"), 0, 2**40),
        "index": meta.get("index") is None or _integer(meta.get("index"), 0, 1 << 16),
    }
    for field, ok in checks.items():
        if not ok:
            raise ValueError(f"bad {field!r} ({printable(repr(meta.get(field)))[:60]})")
    user = owner
    named = meta.get("user")
    if by_root and isinstance(named, str) and 0 < len(named) <= 64 and named.isprintable():
        user = named
    return LeaseInfo(
        uuid=uuid,
        user=user,
        pid=meta["pid"],
        # Shown by status and the exporter: another user's text, escaped once here.
        command=printable(meta.get("command", "")),
        started=float(meta["started"]),
        mem=meta.get("mem"),
        job=job,
        expires=None if meta.get("expires") is None else float(meta["expires"]),
        index=meta.get("index"),
    )


def unreadable(uuid: str, owner: str, why: str) -> LeaseInfo:
    """What a held lease with metadata we cannot trust counts as: the whole GPU taken.
    Skipping it would make the GPU look free (or its shared memory unclaimed)."""
    return LeaseInfo(uuid, f"{owner} (unreadable lease: {why})", 0, "(unreadable)", 0.0)
