"""`gpuwarden status`: one line per GPU (and per MIG slice) with load, memory, health,
leases and processes; the table itself is `cli.statustable`.

The JSON form (`--json`) is a documented, versioned interface (docs/status-json.md):
fields are only ever added within a schema version.
"""

from __future__ import annotations

import json
import sys
import time

from gpuwarden.cli.statustable import Status, cuda_indices, level, slices, to_text, unleased_pids
from gpuwarden.machine.inventory import Gpu, Snapshot, dotted

TYPE_CHECKING = False  # typing stays off the start-up path; annotations need it only here
if TYPE_CHECKING:
    import argparse
    from typing import Any, Optional

    from gpuwarden.cli import Commands
    from gpuwarden.config import Config

SCHEMA = 1
__all__ = ["Status", "gather", "render", "to_json", "to_text", "unleased_pids"]


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
    parser.add_argument(
        "--hosts",
        metavar="FILE|H1,H2",
        help="every listed host's status in one table, over your ssh (docs/hosts.md)",
    )


def run(args: argparse.Namespace) -> int:
    if args.user is not None:
        _check_user(args.user)
    if args.hosts is not None:
        return _on_hosts(args)
    if args.watch is not None:
        if not 0 < args.watch <= 86400:  # also NaN; time.sleep(inf) raises OverflowError
            from gpuwarden.base.errors import UserError

            raise UserError(
                f"--watch needs a positive number of seconds (a day at most), got {args.watch:g}"
            )
        return _watch(args)
    print(render(gather(args.user), as_json=args.json))
    return 0


def _on_hosts(args: argparse.Namespace) -> int:
    """Each host's own `status --json`, merged; exit 1 when a host did not answer."""
    from gpuwarden.hosts import merge, remote

    if args.watch is not None:
        from gpuwarden.base.errors import UserError

        raise UserError("--hosts shows one moment; --watch is for this machine's status")
    hosts = remote.parse_hosts(args.hosts)
    argv = ["status", "--json", *(["--user", args.user] if args.user else [])]
    merged = merge.merge_status(remote.ask_json(hosts, argv))
    print(json.dumps(merged, indent=2) if args.json else merge.status_text(merged))
    return 0 if all(h["ok"] for h in merged["hosts"]) else 1


def _check_user(name: str) -> None:
    from gpuwarden.base.errors import UserError

    if not name or len(name) > 256 or any(c.isspace() or not c.isprintable() for c in name):
        raise UserError(f"--user needs a user name, got {name!r}")


def gather(user: Optional[str] = None) -> Status:
    """`collect()`, narrowed to one user when `user` is given. A name that is neither an
    account here nor seen on any GPU or lease is one line, not an empty table."""
    from gpuwarden.config import load

    reading = load()  # once: the lease and state directories, the health rules, who sees commands
    data = private(collect(reading), bool(reading.get("service.show_commands")))
    if user is None:
        return data
    mine = for_user(data, user)
    if not mine.machine.snapshot.gpus and not _is_account(user):
        from gpuwarden.base.errors import UserError

        raise UserError(f"no user {user!r} on this machine, and nothing runs under that name")
    return mine


def private(data: Status, show_commands: bool) -> Status:
    """Others' command lines hidden (their leases show user, job, pid and times), as
    `queue` and `jobs` hide them: a command line can carry a path, a token, a
    colleague's unpublished idea. Root sees them, and everyone where the admin set
    `service.show_commands` (`show_commands`)."""
    import os
    import pwd
    from dataclasses import replace

    if os.geteuid() == 0 or show_commands:
        return data
    try:
        me = pwd.getpwuid(os.geteuid()).pw_name  # the kernel's uid, never $USER
    except KeyError:
        me = str(os.geteuid())
    leases = tuple(x if x.user == me else replace(x, command="") for x in data.machine.leases)
    return replace(data, machine=replace(data.machine, leases=leases))


def _is_account(name: str) -> bool:
    import pwd

    try:
        pwd.getpwnam(name)
    except KeyError:
        return name.isdigit()  # processes of an account without a name show its uid
    return True


def for_user(data: Status, user: str) -> Status:
    """Only `user`'s part of `data`: the GPUs they lease or run a process on, with only
    their processes and leases (what others hold there stays counted in the memory)."""
    from dataclasses import replace

    snap = data.machine.snapshot
    leases = tuple(x for x in data.machine.leases if x.user == user)
    leased = {x.uuid for x in leases}
    gpus = []
    for g in snap.gpus:
        theirs = tuple(p for p in g.processes if p.user == user)
        used = {p.mig_uuid for p in theirs}
        own = tuple(m for m in slices(g) if m.uuid in leased or m.uuid in used)
        if theirs or g.uuid in leased or own:
            gpus.append(replace(g, processes=theirs, mig_instances=own))
    machine = replace(data.machine, snapshot=replace(snap, gpus=tuple(gpus)), leases=leases)
    return replace(data, machine=machine, user=user)


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


def collect(reading: Config) -> Status:
    """Everything status shows, gathered once: the machine view and CUDA's view of it
    (`reading`: the lease and state directories and the health rules)."""
    from gpuwarden.machine.inventory import read_snapshot
    from gpuwarden.monitoring.machineview import read_view

    snap = read_snapshot()
    visible = None
    if snap.gpus:
        from gpuwarden.placement.visible import resolve

        visible = resolve(snap)
    return Status(read_view(snap, config=reading), visible)


def render(data: Status, as_json: bool = False) -> str:
    return json.dumps(to_json(data), indent=2) if as_json else to_text(data)


# --- JSON ------------------------------------------------------------------------------


def to_json(data: Status) -> dict[str, Any]:
    snap: Snapshot = data.machine.snapshot
    view = data.visible
    cuda = cuda_indices(view)
    leases = list(data.machine.leases)
    if leases:
        from gpuwarden.machine.ancestry import lineage
    gpus = []
    for g in snap.gpus:
        findings = data.machine.findings.get(g.uuid, ())
        drain = data.machine.drains.get(g.uuid)
        gpus.append(
            {
                **_gpu_json(g),
                "cuda_index": cuda[g.uuid][0] if g.uuid in cuda else None,
                "cuda_indices": cuda.get(g.uuid, []),
                "health": {
                    "level": level(findings),
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
                "leases": [_lease_json(x, snap.taken_at) for x in leases if x.uuid == g.uuid],
                # Processes under no lease (unreserved use), where leases are in use.
                "unleased_pids": sorted(
                    unleased_pids(g, [x for x in leases if x.uuid == g.uuid], lineage)
                )
                if leases
                else [],
            }
        )
        gpus[-1]["mig_instances"] = [
            _slice_json(g, m, snap.taken_at, leases, cuda, lineage if leases else None)
            for m in slices(g)
        ]
    return {
        "schema": SCHEMA,
        "hostname": snap.hostname,
        "taken_at": snap.taken_at,
        "source": snap.source,
        "driver_version": snap.driver_version,
        "cuda_driver_version": dotted(snap.cuda_driver_version),
        "nvml_version": snap.nvml_version,
        "error": snap.error,
        "user": data.user,
        "cuda_visible_devices": getattr(view, "value", None),
        "cuda_device_order": getattr(view, "device_order", None),
        "warnings": list(getattr(view, "warnings", ())) + list(getattr(view, "problems", ())),
        "gpus": gpus,
    }


def _lease_json(x: Any, taken_at: float) -> dict[str, Any]:
    return {
        "user": x.user,
        "pid": x.pid,
        "command": x.command,
        "started": x.started,
        "age": max(0.0, taken_at - x.started),
        "expires": x.expires,
        "mem": x.mem,
        "job": x.job,
    }


def _slice_json(
    g: Gpu, m: Any, taken_at: float, leases: list[Any], cuda: dict[str, list[int]], lineage: Any
) -> dict[str, Any]:
    """A MIG slice under its parent: what NVML says of it, plus what status adds of a
    GPU (its leases, its processes under none, CUDA's index for it). Its processes are
    the parent's `processes` whose `mig_uuid` is its `uuid`."""
    from dataclasses import asdict

    mine = [x for x in leases if x.uuid in (g.uuid, m.uuid)]
    pids = {p.pid for p in g.processes if p.mig_uuid == m.uuid}
    free = (
        None if m.memory_total is None or m.memory_used is None else m.memory_total - m.memory_used
    )
    found = asdict(m)
    del found["counters"]  # the exporter's (gpuwarden.exporter.counters); status never reads them
    return {
        **found,
        "memory_free": None if free is None else max(0, free),
        "cuda_index": cuda[m.uuid][0] if m.uuid in cuda else None,
        "leases": [_lease_json(x, taken_at) for x in leases if x.uuid == m.uuid],
        "unleased_pids": sorted(pids & unleased_pids(g, mine, lineage)) if lineage else [],
    }


def _gpu_json(g: Gpu) -> dict[str, Any]:
    from dataclasses import asdict

    out = asdict(g)
    del out["counters"]  # the exporter's (gpuwarden.exporter.counters); status never reads them
    out["compute_capability"] = dotted(g.compute_capability)
    out["throttle_reasons"] = list(g.throttle_reasons) if g.throttle_reasons is not None else None
    return out
