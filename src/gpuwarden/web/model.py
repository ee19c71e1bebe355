"""The page's data: one pure function from what the machine looks like to the API document.

`build()` is the whole `/api/v1/state` document (schema: `schema/state-v1.json`,
docs/web.md). It reads nothing and changes nothing, so it is tested on hand-built
snapshots; the server (`web.server`) gathers its inputs once per interval and
shares the encoded result among every open page.

Strings that other users control (process names, commands, drain reasons, job
names) are passed through as text, truncated to a bounded length: the page
shows them with `textContent`, never as markup. Commands are left out unless
the admin asked for them (`web.show_commands`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Optional

from gpuwarden.machine.gpuprocesses import GpuProcess
from gpuwarden.machine.inventory import Gpu, Snapshot, dotted
from gpuwarden.web.queue import merge_users, section
from gpuwarden.web.values import finite, text, user_row

API_VERSION = 1
FAULTS_SHOWN = 20  # most recent XID events in the document


def _since(now: float, then: Optional[float]) -> Optional[float]:
    return None if then is None else max(0.0, now - then)


def reserved(
    process: GpuProcess, leases: Sequence[Any], owners: Optional[Mapping[str, str]] = None
) -> bool:
    """Whether a process on a GPU belongs to one of that GPU's leases: its pid is a
    lease holder's, or its owner holds a lease there. Anything else is unreserved use
    (somebody running on a GPU without `gpuwarden run`/`reserve`). `owners` maps the
    queue service's running jobs to their users (see `lease_user`)."""
    return any(
        x.pid == process.pid or (process.user and lease_user(x, owners) == process.user)
        for x in leases
    )


def lease_user(lease: Any, owners: Optional[Mapping[str, str]]) -> str:
    """Whose a lease is. The queue service holds its jobs' leases itself (as root) and
    names the job in them: such a lease is the user's whose job it is, as the service
    says. Only a lease file root owns (the kernel says so, `st_uid`) is read this way:
    anyone else's naming a job number claims nothing."""
    if owners and lease.job is not None and str(lease.job) in owners:
        from gpuwarden.files.safefiles import owner_name

        if lease.user == owner_name(0):
            return owners[str(lease.job)]
    return lease.user


def build(
    snapshot: Snapshot,
    *,
    leases: Iterable[Any] = (),
    drains: Optional[Mapping[str, Any]] = None,
    findings: Optional[Mapping[str, Sequence[Any]]] = None,
    xid_events: Sequence[Mapping[str, Any]] = (),
    waiters: Sequence[Any] = (),
    history: Optional[Mapping[str, Mapping[str, list]]] = None,
    watch: Optional[Mapping[str, Any]] = None,
    now: float,
    interval: float = 1.0,
    show_commands: bool = False,
    describe: Any = None,
    fatal_xids: Optional[Iterable[int]] = None,
    service: Optional[Mapping[str, Any]] = None,
    peers: Sequence[Mapping[str, Any]] = (),
) -> dict[str, Any]:
    """The `/api/v1/state` document for one moment.

    `leases` are `leases.LeaseInfo`, `drains` `drain.Drain` by UUID, `findings`
    `health.Symptom`s by UUID, `xid_events` the XID log's entries, `waiters`
    `waitline.Waiter`s in arrival order, `history` per-UUID series from
    `web.history.History.series()`; `describe` turns a waiter's request into words;
    `fatal_xids` (default: the built-in list) marks the fault lines that are fatal;
    `service` is what `web.queue.ask()` got from the queue service (None: not asked);
    `peers` the other hosts' pages as `web.peers.summary` made them (none: no --peers).
    """
    drains = drains or {}
    findings = findings or {}
    history = history or {}
    by_gpu: dict[str, list[Any]] = {}
    for lease in leases:
        by_gpu.setdefault(lease.uuid, []).append(lease)
    index = {g.uuid: g.index for g in snapshot.gpus}
    queue, shares = section(service, now, show_commands, index)
    owners = {str(j["id"]): j["user"] for j in queue["running"]}
    gpus = [
        _gpu(
            g,
            by_gpu,
            drains.get(g.uuid),
            findings.get(g.uuid, ()),
            history.get(g.uuid),
            now,
            show_commands,
            owners,
        )
        for g in snapshot.gpus
    ]
    return {
        "api": API_VERSION,
        "hostname": text(snapshot.hostname),
        "taken_at": snapshot.taken_at,
        "now": now,
        "interval": interval,
        "source": snapshot.source,
        "driver_version": snapshot.driver_version,
        "cuda_driver_version": dotted(snapshot.cuda_driver_version),
        "error": snapshot.error,
        "show_commands": show_commands,
        "watch": dict(watch) if watch is not None else {"running": False, "listening": False},
        "gpus": gpus,
        "users": merge_users(_users(gpus), shares, queue),
        "waitline": [_waiter(w, now, describe) for w in waiters],
        "queue": queue,
        "faults": _faults(xid_events, index, fatal_xids),
        "peers": [dict(p) for p in peers],
    }


def _gpu(
    g: Gpu,
    by_gpu: Mapping[str, list[Any]],
    drain: Any,
    findings: Sequence[Any],
    history: Optional[Mapping[str, list]],
    now: float,
    show_commands: bool,
    owners: Mapping[str, str],
) -> dict[str, Any]:
    from gpuwarden.health.judgement import level

    leases = by_gpu.get(g.uuid, [])
    # A MIG slice is what a job is given (gpuwarden.placement.mig): its leases are its own, and a
    # process in it is reserved by a lease on it (or on the whole GPU).
    slices = sorted(g.mig_instances, key=lambda m: m.index) if g.mig_mode else []
    slice_of = {m.uuid: m.index for m in slices}
    processes = [
        {
            "pid": p.pid,
            "user": text(p.user) if p.user else None,
            "name": text(_program(p.command)) if p.command else None,
            "command": text(p.command) if show_commands and p.command else None,
            "memory": p.used_memory,
            "reserved": reserved(p, leases + by_gpu.get(p.mig_uuid or "", []), owners),
            "slice": slice_of.get(p.mig_uuid or ""),
        }
        for p in g.processes
    ]
    by_processes = sum(p.used_memory or 0 for p in g.processes)
    other = None if g.memory_used is None else max(0, g.memory_used - by_processes)
    return {
        "index": g.index,
        "uuid": g.uuid,
        "name": text(g.name) if g.name else None,
        "lost": g.lost,
        "error": text(g.error) if g.error else None,
        "memory_total": g.memory_total,
        "memory_used": g.memory_used,
        "memory_free": g.memory_free,
        "memory_other": other,
        "utilization": g.utilization_gpu,
        "temperature": g.temperature,
        "power_draw": g.power_draw,
        "power_limit": g.power_limit,
        "mig": bool(g.mig_mode),
        "processes": processes,
        "health": {
            "level": level(tuple(findings)),
            "findings": [
                {
                    "level": f.level,
                    "reason": text(f.reason),
                    "action": text(f.action),
                    "code": text(getattr(f, "code", "")),
                }
                for f in findings
            ],
        },
        "drain": None
        if drain is None
        else {
            "reason": text(drain.reason),
            "by": text(drain.by),
            "at": finite(drain.at),
            "auto": bool(drain.auto),
        },
        "leases": [_lease(x, now, show_commands, owners) for x in leases],
        "slices": [
            {
                "index": m.index,
                "uuid": m.uuid,
                "profile": text(m.name) if m.name else None,
                "memory_total": m.memory_total,
                "memory_used": m.memory_used,
                "leases": [_lease(x, now, show_commands, owners) for x in by_gpu.get(m.uuid, [])],
            }
            for m in slices
        ],
        "history": {
            "t": list(history.get("t", [])) if history else [],
            "utilization": list(history.get("utilization", [])) if history else [],
            "temperature": list(history.get("temperature", [])) if history else [],
        },
    }


def _program(command: str) -> str:
    """The program's name alone (what is shown when command lines are hidden)."""
    first = command.split(None, 1)[0] if command.strip() else command
    return first.rsplit("/", 1)[-1]


def _lease(x: Any, now: float, show_commands: bool, owners: Mapping[str, str]) -> dict[str, Any]:
    started, expires = finite(x.started), finite(x.expires)
    return {
        "job": text(x.job) if x.job is not None else None,
        "user": text(lease_user(x, owners)),
        "pid": x.pid,
        "started": started,
        "age": _since(now, started),
        "expires": expires,
        "expires_in": None if expires is None else expires - now,
        "mem": x.mem,
        "command": text(x.command) if show_commands and x.command else None,
    }


def _users(gpus: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per user, now: GPUs leased, GPUs their processes are on, memory, unreserved use."""
    users: dict[str, dict[str, Any]] = {}

    def entry(name: str) -> dict[str, Any]:
        return users.setdefault(name, user_row(name))

    for g in gpus:
        for lease in [*g["leases"], *(x for s in g["slices"] for x in s["leases"])]:
            got = entry(lease["user"])
            if g["index"] not in got["leased_gpus"]:
                got["leased_gpus"].append(g["index"])
        for p in g["processes"]:
            got = entry(p["user"] or "?")
            if g["index"] not in got["used_gpus"]:
                got["used_gpus"].append(g["index"])
            got["memory"] += p["memory"] or 0
            got["processes"] += 1
            got["unreserved"] += 0 if p["reserved"] else 1
    return sorted(users.values(), key=lambda u: (-len(u["used_gpus"]), -u["memory"], u["user"]))


def _waiter(w: Any, now: float, describe: Any) -> dict[str, Any]:
    request = getattr(w, "request", None)
    wants = describe(request) if describe is not None and request is not None else ""
    since = finite(w.since)
    return {
        "user": text(w.user),
        "pid": w.pid,
        "since": since,
        "waited": _since(now, since),
        "wants": text(wants),
    }


def _faults(
    events: Sequence[Mapping[str, Any]],
    index: Mapping[str, int],
    fatal_xids: Optional[Iterable[int]],
) -> list[dict]:
    """The most recent XID events, newest first, judged with the XID catalogue."""
    from gpuwarden.health.judgement import DEFAULT_FATAL_XIDS, describe_xid

    fatal = DEFAULT_FATAL_XIDS if fatal_xids is None else frozenset(fatal_xids)

    out = []
    for event in list(events)[-FAULTS_SHOWN:][::-1]:
        try:
            xid = int(event["xid"])
            uuid = str(event["uuid"])
            at = finite(float(event.get("at", 0)))
        except (KeyError, TypeError, ValueError):
            continue
        what, _action = describe_xid(xid)
        out.append(
            {
                "at": at,
                "uuid": text(uuid),
                "index": index.get(uuid),
                "xid": xid,
                "fatal": xid in fatal,
                "description": text(what),
            }
        )
    return out
