"""The cells and lines of `gpuwarden queue`'s table, from plain values.

Two sides write the same table: the service, from the jobs it keeps, for a
listing of any length (service.queuetext: the client prints its lines as they
come, without decoding a row), and the client, from rows as dicts (Slurm's, and
other hosts' for `queue --hosts`: cli.jobtables). Both go through these
functions, so the table reads the same whichever wrote it.
"""

from __future__ import annotations

TYPE_CHECKING = False  # typing stays off the client's start-up
if TYPE_CHECKING:
    from collections.abc import Sequence
    from typing import Optional

HEADERS = (
    "JOB",
    "USER",
    "STATE",
    "GPUS",
    "REASON",
    "PRIORITY",
    "WAITED",
    "ELAPSED",
    "LIMIT",
    "CPU",
    "PEAKMEM",
    "COMMAND",
)
RIGHT = (0, 5, 6, 7, 8, 9, 10)  # the columns of numbers, right-aligned
ACCOUNT = 2  # where the ACCOUNT column goes when a job was charged to one


def span(seconds: Optional[float]) -> str:
    """`45s`, `12m03s`, `3h05m`, `2d04h`; `-` when unknown."""
    if seconds is None:
        return "-"
    seconds = max(0, round(seconds))
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    if seconds < 86400:
        return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"
    return f"{seconds // 86400}d{seconds % 86400 // 3600:02d}h"


def gpus(uuids: Sequence[object], indices: Sequence[object], count: object, mem: object) -> str:
    """How many GPUs a job holds and on which (nvidia-smi indices: "2@0,1", a MIG
    slice as "1@3(MIG)"), or how many it waits for ("(2)"): a count always comes
    first, so an index is never read as one."""
    if uuids or indices:
        where = [
            ("?" if i is None else str(i))
            + ("(MIG)" if n < len(uuids) and str(uuids[n]).startswith("MIG-") else "")
            for n, i in enumerate(indices or [None] * len(uuids))
        ]
        return f"{len(where)}@{','.join(where)}"
    return f"({count or 0}{'' if not mem else ' shared'})"


def runs_note(restarts: Optional[int], preempted: Optional[int]) -> str:
    """` (run 3, preempted 1x)` for a job queued again (requeued, retried, preempted)."""
    restarts, preempted = restarts or 0, preempted or 0
    if not restarts and not preempted:
        return ""
    return f" (run {restarts + 1}" + (f", preempted {preempted}x" if preempted else "") + ")"


def reason(why: Optional[str], preemptible: object, starts_in: Optional[float], note: str) -> str:
    """Why a job waits (or `preemptible`, `-`), when it should start, and its runs."""
    text = why or ("preemptible" if preemptible else "-")
    if starts_in is not None:
        text += f" (start in ~{span(starts_in)})"
    return text + note


def lines(headers: Sequence[str], rows: Sequence[Sequence[str]], right: Sequence[int]) -> list[str]:
    """The header and each row, columns padded to their widest cell (those in `right`
    to the right), the last one never padded; one format for every row, so a long
    table costs one formatting call a row."""
    last = len(headers) - 1
    widths = [len(h) for h in headers]
    for i, column in enumerate(list(zip(*rows))[:last]):
        widths[i] = max(widths[i], max(map(len, column)))
    spec = "  ".join([*(f"%{'' if i in right else '-'}{widths[i]}s" for i in range(last)), "%s"])
    out = [(spec % tuple(headers)).rstrip()]
    out += [(spec % tuple(row)).rstrip() for row in rows]
    return out
