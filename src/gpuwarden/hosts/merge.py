"""The hosts' replies merged into one view (pure): a status document and table with a
HOST column, one queue, and where N GPUs are free.

A reply comes from another machine, so every field is read as untrusted: a value of
the wrong type is shown as `n/a` and text is made printable, never trusted to be the
shape this version prints. A host without a usable reply keeps its place, with why.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Optional

from gpuwarden.files.safefiles import printable

SCHEMA = 1


def merge_status(answers: Sequence[tuple[str, Optional[Any], str]]) -> dict[str, Any]:
    """`status --hosts --json`: each host's own `status --json` document under its name,
    in the order given, or its error (schemas/status-hosts.json)."""
    hosts = []
    for host, doc, error in answers:
        if doc is not None and not _is_status(doc):
            doc, error = None, "answered with a document that is not `status --json`'s"
        hosts.append({"host": host, "ok": doc is not None, "error": error or None, "status": doc})
    return {"schema": SCHEMA, "hosts": hosts}


def _is_status(doc: Any) -> bool:
    return (
        isinstance(doc, dict)
        and isinstance(doc.get("gpus"), list)
        and all(isinstance(g, dict) for g in doc["gpus"])
    )


def _text(value: Any, limit: int = 60) -> str:
    if value is None:
        return "n/a"
    return printable(str(value))[:limit]


def _number(value: Any) -> Optional[float]:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    return float(value) if ok and value == value else None


def _size(value: Any) -> str:
    from gpuwarden.base.units import format_size

    number = _number(value)
    return "n/a" if number is None or number < 0 else format_size(int(number))


def _short(name: Any) -> str:
    text = _text(name, 40)
    for prefix in ("NVIDIA GeForce ", "NVIDIA ", "Tesla "):
        if text.startswith(prefix):
            return text[len(prefix) :]
    return text


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def gpu_row(host: str, gpu: Mapping[str, Any]) -> list[str]:
    util, temp = _number(gpu.get("utilization_gpu")), _number(gpu.get("temperature"))
    health = gpu.get("health")
    level = health.get("level") if isinstance(health, dict) else None
    drain = gpu.get("drain")
    leases = _list(gpu.get("leases"))
    procs = _list(gpu.get("processes"))
    users = sorted({_text(p.get("user"), 32) for p in procs if isinstance(p, dict)})
    held = sorted({_text(x.get("user"), 32) for x in leases if isinstance(x, dict)})
    return [
        host,
        _text(gpu.get("index"), 8),
        _short(gpu.get("name")),
        "n/a" if temp is None else f"{temp:.0f}C",
        "n/a" if util is None else f"{util:.0f}%",
        f"{_size(gpu.get('memory_used'))}/{_size(gpu.get('memory_total'))}",
        _text(level, 12) + (" drained" if isinstance(drain, dict) else ""),
        ",".join(held) or "-",
        ",".join(users) or "-",
    ]


def status_text(merged: Mapping[str, Any]) -> str:
    """One table of every answering host's GPUs, then one line per host without an
    answer (or without GPUs), so a dead host never hides the others."""
    from gpuwarden.base.table import render

    rows, notes = [], []
    for entry in merged["hosts"]:
        host = printable(entry["host"])
        doc = entry["status"]
        if doc is None:
            notes.append(f"{host}: {entry['error']}")
            continue
        gpus = doc["gpus"]
        if not gpus:
            notes.append(f"{host}: no GPUs ({_text(doc.get('error') or 'NVML found none', 200)})")
        rows += [gpu_row(host, g) for g in gpus]
    head = ["HOST", "GPU", "NAME", "TEMP", "UTIL", "MEMORY", "HEALTH", "LEASES", "USERS"]
    parts = [render(head, rows)] if rows else []
    return "\n".join(parts + notes)


_NUMBERS = frozenset(
    ("priority", "submitted", "started", "estimated_start", "elapsed", "time_limit", "count")
) | {"cpu_seconds"}
_INTEGERS = frozenset(("mem_peak", "mem", "id"))
_LISTS = frozenset(("indices", "gpus", "command"))


def _job(raw: Mapping[str, Any], host: str) -> dict[str, Any]:
    """A job of another host's queue in the shape `queue`'s table reads: numbers are
    numbers (else None), lists hold text or numbers, text is printable and bounded."""
    job: dict[str, Any] = {}
    for key, value in raw.items():
        if key in _NUMBERS:
            value = value if _number(value) is not None else None
        elif key in _INTEGERS:
            ok = isinstance(value, int) and not isinstance(value, bool)
            value = value if ok else (_text(value, 40) if key == "id" else None)
        elif key in _LISTS:
            good = isinstance(value, list)
            value = [x if isinstance(x, (int, str)) else None for x in value] if good else None
        elif isinstance(value, str):
            value = printable(value)[:500]
        elif not isinstance(value, (bool, int, float)) or value != value:
            value = None
        job[str(key)] = value
    job["host"] = host
    return job


def merge_jobs(answers: Sequence[tuple[str, Optional[Any], str]]) -> dict[str, Any]:
    """`queue --hosts --json`: every host's jobs, each with its `host`, and every host with
    whether its queue could be read, and why not."""
    jobs: list[Any] = []
    hosts = []
    for host, doc, error in answers:
        jobs_ok = isinstance(doc, list) and all(isinstance(j, dict) for j in doc)
        if doc is not None and not jobs_ok:
            doc, error = None, "answered with something that is not a list of jobs"
        hosts.append({"host": host, "ok": doc is not None, "error": error or None})
        jobs += [_job(job, host) for job in doc or ()]
    return {"schema": SCHEMA, "hosts": hosts, "jobs": jobs}


def notes(merged: Mapping[str, Any]) -> list[str]:
    """One line per host that did not answer."""
    return [f"{printable(h['host'])}: {h['error']}" for h in merged["hosts"] if not h["ok"]]


def where_free(answers: Sequence[tuple[str, str, str]]) -> tuple[list[tuple[str, str]], list[str]]:
    """`select --hosts`: from each host's own `select` (its IDs, or why not), the hosts
    where the request fits now, in the order given, and a line for every other."""
    fits, notes = [], []
    for host, ids, error in answers:
        ids = ids.strip()
        if ids and not error and all(c.isalnum() or c in ",-:" for c in ids):
            fits.append((host, ids))
        else:
            notes.append(f"{printable(host)}: {error or 'no usable answer'}")
    return fits, notes
