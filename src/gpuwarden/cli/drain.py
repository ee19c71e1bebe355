"""`gpuwarden drain IDS --reason TEXT` / `gpuwarden undrain IDS` (and `drain` alone lists)."""

from __future__ import annotations

TYPE_CHECKING = False  # argparse is read only by type checkers here
if TYPE_CHECKING:
    import argparse

    from gpuwarden.cli import Commands


def register(commands: Commands, command_name: str) -> None:
    from gpuwarden.cli import subcommand

    parser = subcommand(commands, command_name)
    parser.add_argument(
        "ids",
        nargs="*",
        metavar="IDS",
        help="GPUs: nvidia-smi indices or UUID prefixes, comma- or space-separated"
        + ("; none lists the drains" if command_name == "drain" else ""),
    )
    if command_name == "drain":
        parser.add_argument("--reason", metavar="TEXT", help="why (shown to everyone)")
    parser.add_argument("--json", action="store_true", help="print the drains as JSON")


def _split(ids: list[str]) -> list[str]:
    """The IDs named, one per comma-separated part; an empty one is an error (an
    empty argument must not turn `drain '' --reason x` into a listing that exits 0)."""
    from gpuwarden.base.errors import UserError
    from gpuwarden.files.safefiles import printable

    parts = [part.strip() for item in ids for part in item.split(",")]
    if ids and not all(parts):
        raise UserError(
            f"empty GPU ID in {printable(' '.join(repr(i) for i in ids))}: "
            "name GPUs by index or UUID prefix"
        )
    return parts


def _targets(ids: list[str], drains: dict) -> list[tuple[str, str]]:
    """(uuid, label) per ID. IDs resolve through the machine; undrain also accepts a
    drained UUID prefix of a GPU that is no longer seen (lost, removed)."""
    from gpuwarden.base.errors import UserError
    from gpuwarden.base.units import is_digits
    from gpuwarden.machine.inventory import read_snapshot
    from gpuwarden.placement.selection import resolve_ids

    snapshot = read_snapshot(processes=False)
    out: list[tuple[str, str]] = []
    for text in ids:
        try:
            gpu = resolve_ids(snapshot, [text])[0]
            target = (gpu.uuid, f"GPU {gpu.index} ({gpu.uuid})")
        except UserError:
            low = text.lower()
            known = {g.uuid for g in snapshot.gpus}
            gone = [u for u in drains if u not in known and u.lower().startswith(low)]
            if len(gone) != 1 or is_digits(text):
                raise
            target = (gone[0], gone[0])
        if target not in out:
            out.append(target)
    return out


def _still_running(uuids: set[str]) -> list[str]:
    """What keeps running on the GPUs just drained (a drain stops nothing): one line per
    lease, naming a Slurm job by its id when the prolog's user (root) holds it."""
    from gpuwarden import leases
    from gpuwarden.base.errors import UserError
    from gpuwarden.files.paths import user_name
    from gpuwarden.files.safefiles import printable

    try:
        found = [i for i in leases.list_leases() if i.uuid in uuids]
    except (OSError, UserError):
        return []
    lines = []
    for info in found:
        job = info.job or ""
        if info.user == user_name(0) and job.startswith("slurm-"):
            who = f"Slurm job {job[len('slurm-') :]}"
        else:
            who = f"{info.user}'s job {job or info.pid}"
        gpu = "?" if info.index is None else info.index
        lines.append(f"GPU {gpu}: {printable(who)} keeps running on it until it ends")
    return lines


def run(args: argparse.Namespace) -> int:
    import json
    import time

    from gpuwarden.base.errors import UserError
    from gpuwarden.files.locations import state_location
    from gpuwarden.files.safefiles import printable
    from gpuwarden.health.drain import drain, list_drains, undrain

    where = state_location()
    drains = list_drains(where)

    ids = _split(args.ids)
    if not ids:
        if args.command == "undrain":
            raise UserError("name the GPUs to undrain (indices or UUID prefixes)")
        if args.json:
            print(json.dumps([d.__dict__ for d in drains.values()], indent=2))
        elif not drains:
            print("no GPU is drained")
        for d in [] if args.json else drains.values():
            when = time.strftime("%Y-%m-%d %H:%M", time.localtime(d.at))
            # d.reason and d.by are escaped when read; the UUID comes from a file name.
            print(f"{printable(d.uuid)}: drained by {d.who} at {when}: {d.reason}")
        return 0
    targets = _targets(ids, drains)
    from gpuwarden import config

    # who besides root may change drains in a shared state directory
    admins = tuple(str(a) for a in config.load().get("service.admins") or ())
    if args.command == "drain":
        if not args.reason or not args.reason.strip():
            raise UserError("a drain needs a reason: --reason TEXT (others will see it)")
        for uuid, label in targets:
            drain(uuid, args.reason, directory=where, admins=admins)
            print(f"drained {label}: {printable(args.reason.strip())}")
        for line in _still_running({uuid for uuid, _ in targets}):
            print(line)
    else:
        for uuid, label in targets:
            undrain(uuid, directory=where, admins=admins)
            print(f"undrained {label}")
    return 0
