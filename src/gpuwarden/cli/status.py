"""`gpuwarden status`: one line per GPU with load, memory, health, leases and processes.

The JSON form (`--json`) is a documented, versioned interface (docs/status-json.md):
fields are only ever added within a schema version.
"""

from __future__ import annotations

import json
import sys
import time

from gpuwarden.inventory import Gpu, Snapshot, dotted

TYPE_CHECKING = False  # typing stays off the start-up path; annotations need it only here
if TYPE_CHECKING:
    import argparse
    from typing import Any, Optional

    from gpuwarden.cli import Commands

SCHEMA = 1
_SHORT_NAMES = ("NVIDIA GeForce ", "NVIDIA ", "Tesla ")


def register(commands: Commands, name: str) -> None:
    from gpuwarden.cli import subcommand

    parser = subcommand(commands, name)
    parser.add_argument("--json", action="store_true", help="print a JSON document (schema 1)")
    parser.add_argument(
        "--watch",
        nargs="?",
        const=2.0,
        type=float,
        metavar="SECONDS",
        help="refresh every SECONDS (default 2) until Ctrl-C: in place on a terminal, "
        "else one plain frame after another",
    )
    parser.add_argument(
        "--user",
        metavar="NAME",
        help="only the GPUs, processes and leases of this user",
    )


def run(args: argparse.Namespace) -> int:
    if args.user is not None:
        _check_user(args.user)
    if args.watch is not None:
        if not 0 < args.watch <= 86400:  # also NaN; time.sleep(inf) raises OverflowError
            from gpuwarden.errors import UserError

            raise UserError(
                f"--watch needs a positive number of seconds (a day at most), got {args.watch:g}"
            )
        return _watch(args)
    from gpuwarden.cli.oneshot import one_shot

    with one_shot():
        print(render(gather(args.user), as_json=args.json))
    return 0


def _check_user(name: str) -> None:
    from gpuwarden.errors import UserError

    if not name or len(name) > 256 or any(c.isspace() or not c.isprintable() for c in name):
        raise UserError(f"--user needs a user name, got {name!r}")


def gather(user: Optional[str] = None) -> dict[str, Any]:
    """`collect()`, narrowed to one user when `user` is given. A name that is neither an
    account here nor seen on any GPU or lease is one line, not an empty table."""
    data = collect()
    if user is None:
        return data
    mine = for_user(data, user)
    if not mine["snapshot"].gpus and not _is_account(user):
        from gpuwarden.errors import UserError

        raise UserError(f"no user {user!r} on this machine, and nothing runs under that name")
    return mine


def _is_account(name: str) -> bool:
    import pwd

    try:
        pwd.getpwnam(name)
    except KeyError:
        return name.isdigit()  # processes of an account without a name show its uid
    return True


def for_user(data: dict[str, Any], user: str) -> dict[str, Any]:
    """Only `user`'s part of `data`: the GPUs they lease or run a process on, with only
    their processes and leases (what others hold there stays counted in the memory)."""
    from dataclasses import replace

    snap: Snapshot = data["snapshot"]
    leases = [x for x in data["leases"] if isinstance(x, Exception) or x.user == user]
    leased = {x.uuid for x in leases if not isinstance(x, Exception)}
    gpus = []
    for g in snap.gpus:
        theirs = tuple(p for p in g.processes if p.user == user)
        if theirs or g.uuid in leased:
            gpus.append(replace(g, processes=theirs))
    return {**data, "snapshot": replace(snap, gpus=tuple(gpus)), "leases": leases, "user": user}


def _watch(args: argparse.Namespace) -> int:
    """Redraw in place on a terminal. Anywhere else (a file, a pipe, `tee`) cursor codes
    would only be noise, so each frame is written whole after the last: text frames
    under a `--- time ---` line and a blank line, JSON frames one compact document
    per line (JSON Lines), so `status --json --watch 5 > log.jsonl` can be read back."""
    terminal = sys.stdout.isatty()
    try:
        while True:
            data = gather(args.user)
            if terminal:
                text = render(data, as_json=args.json)
                stamp = time.strftime("%H:%M:%S")
                sys.stdout.write(
                    f"\x1b[H\x1b[2J{text}\n\n(every {args.watch:g}s, {stamp}; Ctrl-C quits)\n"
                )
            elif args.json:
                sys.stdout.write(json.dumps(to_json(data), separators=(",", ":")) + "\n")
            else:
                stamp = time.strftime("%Y-%m-%d %H:%M:%S")
                sys.stdout.write(f"--- {stamp} ---\n{to_text(data)}\n\n")
            sys.stdout.flush()
            time.sleep(args.watch)
    except KeyboardInterrupt:
        if terminal:
            sys.stdout.write("\n")
        return 0


def collect() -> dict[str, Any]:
    """Everything status shows, gathered once: snapshot, CUDA view, leases, drains, health."""
    from gpuwarden.inventory import read_snapshot

    snap = read_snapshot()
    view = _visible(snap)
    leases = _leases()
    if leases:
        from gpuwarden.attribution import attribute

        snap = attribute(snap, leases)  # a container's processes shown as their owner's
    return {
        "snapshot": snap,
        "visible": view,
        "leases": leases,
        "drains": _drains(),
        "health": _health(snap),
    }


def _visible(snap: Snapshot) -> Optional[Any]:
    if not snap.gpus:
        return None
    from gpuwarden.visible import resolve

    return resolve(snap)


def _leases() -> list[Any]:
    from gpuwarden.leases import list_leases

    try:
        return list(list_leases())
    except Exception as err:  # status must still show GPUs when the lease dir is unreadable
        return [err]


def _drains() -> dict[str, Any]:
    from gpuwarden.drain import list_drains

    try:
        return dict(list_drains())
    except Exception:
        return {}


def _health(snap: Snapshot) -> dict[str, tuple[Any, ...]]:
    from gpuwarden import health

    try:
        from gpuwarden.xidlog import judged

        return judged(snap.gpus)
    except Exception:  # status must still show the GPUs, judged without the XID log
        return {g.uuid: health.judge(g) for g in snap.gpus}


def _cuda_indices(view: Any) -> dict[str, list[int]]:
    found: dict[str, list[int]] = {}
    for dev in getattr(view, "devices", ()):
        found.setdefault(dev.uuid, []).append(dev.cuda_index)
    return found


def render(data: dict[str, Any], as_json: bool = False) -> str:
    return json.dumps(to_json(data), indent=2) if as_json else to_text(data)


# --- JSON ------------------------------------------------------------------------------


def to_json(data: dict[str, Any]) -> dict[str, Any]:
    snap: Snapshot = data["snapshot"]
    view = data["visible"]
    cuda = _cuda_indices(view)
    leases = [x for x in data["leases"] if not isinstance(x, Exception)]
    if leases:
        from gpuwarden.ancestry import lineage
    gpus = []
    for g in snap.gpus:
        findings = data["health"].get(g.uuid, ())
        drain = data["drains"].get(g.uuid)
        gpus.append(
            {
                **_gpu_json(g),
                "cuda_index": cuda[g.uuid][0] if g.uuid in cuda else None,
                "cuda_indices": cuda.get(g.uuid, []),
                "health": {
                    "level": _level(findings),
                    "findings": [
                        {
                            "level": f.level,
                            "reason": f.reason,
                            "action": f.action,
                            "code": getattr(f, "code", ""),
                        }
                        for f in findings
                    ],
                },
                "drain": None
                if drain is None
                else {"reason": drain.reason, "by": drain.by, "at": drain.at, "auto": drain.auto},
                "leases": [
                    {
                        "user": x.user,
                        "pid": x.pid,
                        "command": x.command,
                        "started": x.started,
                        "age": max(0.0, snap.taken_at - x.started),
                        "expires": x.expires,
                        "mem": x.mem,
                        "job": x.job,
                    }
                    for x in leases
                    if x.uuid == g.uuid
                ],
                # Processes under no lease (unreserved use), where leases are in use.
                "unleased_pids": sorted(
                    unleased_pids(g, [x for x in leases if x.uuid == g.uuid], lineage)
                )
                if leases
                else [],
            }
        )
    return {
        "schema": SCHEMA,
        "hostname": snap.hostname,
        "taken_at": snap.taken_at,
        "source": snap.source,
        "driver_version": snap.driver_version,
        "cuda_driver_version": dotted(snap.cuda_driver_version),
        "nvml_version": snap.nvml_version,
        "error": snap.error,
        "user": data.get("user"),
        "cuda_visible_devices": getattr(view, "value", None),
        "cuda_device_order": getattr(view, "device_order", None),
        "warnings": list(getattr(view, "warnings", ())) + list(getattr(view, "problems", ())),
        "gpus": gpus,
    }


def _gpu_json(g: Gpu) -> dict[str, Any]:
    from dataclasses import asdict

    out = asdict(g)
    out["compute_capability"] = dotted(g.compute_capability)
    out["throttle_reasons"] = list(g.throttle_reasons) if g.throttle_reasons is not None else None
    return out


def _level(findings: tuple[Any, ...]) -> str:
    from gpuwarden.health import level

    return level(tuple(findings))


# --- text ------------------------------------------------------------------------------


def _pct(value: Optional[int]) -> str:
    return "n/a" if value is None else f"{value}%"


def _power(draw: Optional[float], limit: Optional[float]) -> str:
    """`62/400W`: drawn and the enforced limit, in one narrow column as nvidia-smi's
    Pwr:Usage/Cap; n/a for what NVML does not report."""
    if draw is None:
        return "n/a" if limit is None else f"n/a/{limit:.0f}W"
    return f"{draw:.0f}W" if limit is None else f"{draw:.0f}/{limit:.0f}W"


def _short(name: Optional[str]) -> str:
    if not name:
        return "n/a"
    for prefix in _SHORT_NAMES:
        if name.startswith(prefix):
            return name[len(prefix) :]
    return name


def to_text(data: dict[str, Any]) -> str:
    from gpuwarden.table import render as table
    from gpuwarden.units import format_size

    snap: Snapshot = data["snapshot"]
    if not snap.gpus and data.get("user") is not None and not snap.error:
        return f"{data['user']} holds no GPU, process or lease here"
    if not snap.gpus:
        return snap.error or "no GPUs found"
    view = data["visible"]
    cuda = _cuda_indices(view)
    value = getattr(view, "value", None)
    show_cuda = value is not None or any(
        cuda.get(g.uuid, [g.index])[0] != g.index for g in snap.gpus
    )
    leases: dict[str, list[Any]] = {}
    lease_error = None
    for x in data["leases"]:
        if isinstance(x, Exception):
            lease_error = str(x)
        else:
            leases.setdefault(x.uuid, []).append(x)
    cuda_version = dotted(snap.cuda_driver_version) or "n/a"
    head = f"{snap.hostname}  driver {snap.driver_version or 'n/a'}  CUDA {cuda_version}"
    if snap.source != "nvml":
        head += f"  [{snap.source}]"
    headers = (
        ["GPU"]
        + (["CUDA"] if show_cuda else [])
        + [
            "NAME",
            "TEMP",
            "FAN",
            "POWER",
            "UTIL",
            "MEMORY",
            "HEALTH",
            "LEASE",
            "PROCESSES",
        ]
    )
    rows = []
    notes = []
    # Where leases are in use (a shared machine), a GPU process under none is marked: it
    # is unreserved use, counted against its user's fair share by the queue service.
    any_lease = bool(leases)
    unreserved = 0
    if any_lease:
        from gpuwarden.ancestry import lineage
    for g in snap.gpus:
        findings = data["health"].get(g.uuid, ())
        lvl = _level(findings)
        if g.lost:
            health_mark = "LOST"
        elif lvl == "ok":
            health_mark = "ok"
        else:
            first = getattr(findings[0], "code", "") or findings[0].reason
            more = f"+{len(findings) - 1}" if len(findings) > 1 else ""
            health_mark = f"{'FATAL' if lvl == 'fatal' else 'warn'}:{first}{more}"
        for f in findings:
            notes.append(f"GPU {g.index}: {f.reason}" + (f" -> {f.action}" if f.action else ""))
        drain = data["drains"].get(g.uuid)
        held = leases.get(g.uuid, [])
        if drain is not None:
            lease_mark = "drained"
            notes.append(f"GPU {g.index}: drained by {drain.by}: {drain.reason}")
        elif held:
            lease_mark = ",".join(
                sorted({x.user + ("(shared)" if x.mem is not None else "") for x in held})
            )
        else:
            lease_mark = "-"
        if g.lost:
            memory = "n/a"
        else:
            memory = f"{format_size(g.memory_used)} / {format_size(g.memory_total)}"
        stray = unleased_pids(g, held, lineage) if any_lease else set()
        procs = (
            " ".join(
                f"{p.user or '?'}({format_size(p.used_memory)}){'*' if p.pid in stray else ''}"
                for p in g.processes
            )
            or "-"
        )
        unreserved += len(stray)
        mark = ""
        if show_cuda:
            ids = cuda.get(g.uuid)
            mark = ",".join(map(str, ids)) if ids else "-"
        temp = "n/a" if g.temperature is None else f"{g.temperature}C"
        name = _short(g.name) + (" [MIG]" if g.mig_mode else "")
        row = (
            [str(g.index)]
            + ([mark] if show_cuda else [])
            + [
                name,
                temp,
                _pct(g.fan_speed),
                _power(g.power_draw, g.power_limit),
                _pct(g.utilization_gpu),
                memory,
                health_mark,
                lease_mark,
                procs,
            ]
        )
        rows.append(row)
    right = {0, 3, 4, 5, 6} if not show_cuda else {0, 1, 4, 5, 6, 7}  # numbers line up
    lines = [head, table(headers, rows, right=sorted(right))]
    if value is not None:
        lines.append(f"CUDA_VISIBLE_DEVICES={value!r} (CUDA column: the index a CUDA program sees)")
    if unreserved:
        lines.append("* a process under no lease: unreserved use (see `gpuwarden enforce`)")
    for text in list(getattr(view, "problems", ())) + list(getattr(view, "warnings", ())):
        lines.append(f"warning: {text}")
    held_rows = _lease_rows(snap, [x for g in snap.gpus for x in leases.get(g.uuid, [])])
    if held_rows:
        lines.append("")
        lines.append(
            table(
                ["LEASE", "USER", "JOB", "PID", "AGE", "EXPIRES", "COMMAND"],
                held_rows,
                right=[3, 4],
            )
        )
    if lease_error:
        lines.append(f"warning: cannot read leases: {lease_error}")
    lines.extend(notes)
    return "\n".join(lines)


def unleased_pids(gpu: Gpu, held: list[Any], lineage_of: Any) -> set[int]:
    """The pids of `gpu`'s processes that belong to none of the leases `held` on it
    (gpuwarden.attribution)."""
    from gpuwarden.attribution import unleased_pids

    return unleased_pids(gpu, held, lineage_of)


def _lease_rows(snap: Snapshot, held: list[Any]) -> list[list[str]]:
    """One row per lease: `GPU n` (with `shared` for a declared-memory lease), its job
    id, user, age and when it expires (`with job`: it ends when its process tree does)."""
    from gpuwarden.units import format_size, format_span

    index = {g.uuid: g.index for g in snap.gpus}
    rows = []
    for x in held:
        gpu = f"GPU {index.get(x.uuid, '?')}"
        if x.mem is not None:
            gpu += f" shared {format_size(x.mem)}"
        if x.expires is None:
            expires = "with job"
        elif x.expires <= snap.taken_at:
            expires = "now"
        else:
            expires = "in " + format_span(x.expires - snap.taken_at)
        age = format_span(max(0.0, snap.taken_at - x.started))
        rows.append([gpu, x.user, x.job or "-", str(x.pid), age, expires, x.command or "-"])
    return rows
