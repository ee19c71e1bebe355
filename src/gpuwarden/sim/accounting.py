"""The driver's accounting mode on the simulated machine: a record per process that ran
on a GPU while the mode was on, kept after the process ends.

As on a real GPU, the mode is off by default and only root turns it on
(`nvmlDeviceSetAccountingMode`, nvidia-smi's `-am 1`); turning it off, or
`nvmlDeviceClearAccountingPids`, empties the GPU's records. A process is recorded
from the first write of the machine's state after it was added (`sim occupy`,
`Machine.add_process`) while the mode is on; processes already running when the mode
went on, and the spec's own, are not (as the driver tracks only processes started
after). Each record keeps the process's start, its peak memory (`maxMemoryUsage`: the
most it held, over every change of its allocation) and its own utilisation, and its
end: the first write after it exited (a reader sees an exited process as ended at
once). At most `BUFFER` records per GPU, the oldest dropped first.

The state holds them as `accounting`: GPU UUID -> {"since": when the mode went on,
"records": [...]}, present only while the mode is on; a record the shape of which is
wrong reads as absent.
"""

from __future__ import annotations

TYPE_CHECKING = False  # typing stays off the start-up path; annotations need it only here
if TYPE_CHECKING:
    from typing import Any, Optional

#: Processes the driver keeps accounting records for (nvmlDeviceGetAccountingBufferSize).
BUFFER = 4000
_SHAPE = {"pid": int, "start": float, "memory": int, "util": int}


def _entry(state: dict[str, Any], uuid: str) -> Optional[dict[str, Any]]:
    table = state.get("accounting")
    entry = table.get(uuid) if isinstance(table, dict) else None
    if not isinstance(entry, dict) or not isinstance(entry.get("records"), list):
        return None
    since = entry.get("since")
    if isinstance(since, bool) or not isinstance(since, (int, float)):
        return None
    return entry


def records(state: dict[str, Any], uuid: str) -> Optional[list[dict[str, Any]]]:
    """The GPU's records (well-formed ones), or None while its accounting mode is off."""
    entry = _entry(state, uuid)
    return None if entry is None else [r for r in entry["records"] if _well_formed(r)]


def _well_formed(record: Any) -> bool:
    if not isinstance(record, dict):
        return False
    for key, kind in _SHAPE.items():
        value = record.get(key)
        wanted = (int, float) if kind is float else kind
        if isinstance(value, bool) or not isinstance(value, wanted):
            return False
    end = record.get("end")
    return end is None or (isinstance(end, (int, float)) and not isinstance(end, bool))


def set_mode(state: dict[str, Any], uuid: str, on: bool, now: float) -> None:
    """Turn the GPU's accounting on (its records kept if it was) or off (emptied)."""
    table = state.get("accounting")
    if not isinstance(table, dict):
        table = state["accounting"] = {}
    if not on:
        table.pop(uuid, None)
    elif _entry(state, uuid) is None:
        table[uuid] = {"since": now, "records": []}


def clear(state: dict[str, Any], uuid: str) -> None:
    entry = _entry(state, uuid)
    if entry is not None:
        entry["records"] = []


def track(state: dict[str, Any], live: list[dict[str, Any]], now: float) -> None:
    """On a write of the state: record each process added while its GPU's mode is on,
    raise its peak memory, and end the records of processes no longer `live`."""
    table = state.get("accounting")
    if not isinstance(table, dict):
        return
    for uuid in list(table):
        entry = _entry(state, uuid)
        if entry is None:
            del table[uuid]
            continue
        kept = [r for r in entry["records"] if _well_formed(r)]
        mine = {p["pid"]: p for p in live if p["gpu"] == uuid and not p.get("synthetic")}
        running = {r["pid"]: r for r in kept if r.get("end") is None}
        for pid, record in running.items():
            if pid not in mine:
                record["end"] = now
        for pid, p in mine.items():
            record = running.get(pid)
            if record is None:
                added = p.get("added")
                if not isinstance(added, (int, float)) or added < entry["since"]:
                    continue  # running before the mode went on: not recorded
                record = {"pid": pid, "start": float(added), "memory": 0, "util": 0, "end": None}
                kept.append(record)
            record["memory"] = max(record["memory"], int(p.get("memory") or 0))
            record["util"] = int(p.get("util") or 0)
        entry["records"] = kept[-BUFFER:]
