"""`gpuwarden reserve` / `gpuwarden release`: hold GPUs for an interactive session.

    eval "$(gpuwarden reserve -g 1 --for 4h)"   # this shell now uses the GPU
    jupyter lab                                 # ... work ...
    eval "$(gpuwarden release)"                 # give it back, unset the variables

The lease is held by a small detached holder process (a fork of this one,
in its own session, with no terminal), so it outlives `reserve` and the shell
that ran it, ends when `release` (or `kill`) stops the holder or `--for`
runs out, and the kernel frees it whichever way the holder goes.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from typing import Any

from gpuwarden.errors import UserError

TYPE_CHECKING = False  # argparse is read only by type checkers here
if TYPE_CHECKING:
    import argparse

    from gpuwarden.cli import Commands

RESERVATION_PREFIX = "res-"
COMMAND = "gpuwarden reserve"
_EXPORTED = (
    "CUDA_VISIBLE_DEVICES",
    "CUDA_DEVICE_ORDER",
    "GPUWARDEN_RESERVATION",
    "GPUWARDEN_GPUS",
    "GPUWARDEN_GPU_INDICES",
    "GPUWARDEN_MEM_LIMIT",
)


def register(commands: Commands, command_name: str) -> None:
    from gpuwarden.cli import subcommand

    parser = subcommand(commands, command_name)
    if command_name == "reserve":
        from gpuwarden.cli.filters import add_lease_options

        parser.usage = 'eval "$(gpuwarden reserve [-g N | --gpus IDS] [--for T] [filters])"'
        add_lease_options(parser)
        parser.add_argument(
            "--for", dest="duration", metavar="T", help="end the reservation after T (4h, 30m)"
        )
    else:
        parser.usage = 'eval "$(gpuwarden release [ID])"'
        parser.add_argument(
            "id",
            nargs="?",
            help="reservation ID (default: $GPUWARDEN_RESERVATION, or your only one)",
        )


def run(args: argparse.Namespace) -> int:
    return reserve(args) if args.command == "reserve" else release(args)


def _quote(value: str) -> str:
    import shlex

    return shlex.quote(value)


def reserve(args: argparse.Namespace) -> int:
    from gpuwarden.cli.filters import request_of
    from gpuwarden.cli.waiting import take
    from gpuwarden.jobs import holding, launch
    from gpuwarden.jobs.holder import hold_in_background

    args.cpu = False
    conf, request = request_of(args)
    if request.count == 0:
        raise UserError("-g 0 reserves nothing; ask for 1 or more GPUs")
    until = seconds = None
    if args.duration is not None:
        from gpuwarden.units import parse_duration

        seconds = parse_duration(args.duration)
        if seconds <= 0:
            raise UserError(f"invalid --for {args.duration!r}: expected a duration above zero")
    job = RESERVATION_PREFIX + os.urandom(4).hex()

    def taking(machine: holding.MachineReader, scope: Any) -> Any:
        return take("reserve", conf, request, machine, scope, job)

    held = holding.hold(request, conf, holding.Face("reserve", take=taking))
    if isinstance(held, holding.ByService):
        # The service owns the lease directory: a holder of our own could not write it,
        # and processes outside a job would count as unreserved use. An interactive
        # session is a job, as with Slurm's salloc.
        n = request.gpu_count
        hint = f" --time {args.duration}" if args.duration else _time_hint(held.socket)
        raise UserError(
            f"a queue service hands out this machine's GPUs ({held.socket}): for an "
            f"interactive session run `gpuwarden run -g {n}{hint} -- $SHELL` (a shell on "
            "the GPUs until you exit it), or `gpuwarden submit` for a batch job"
        )
    if isinstance(held, holding.OnCpu):
        raise UserError(f"{held.reason}: there is no GPU here to reserve")
    if isinstance(held, holding.Enclosed):
        ids = ",".join(str(g.index) for g in held.gpus)
        raise UserError(
            f"already inside {held.job}, whose lease holds GPU {ids} for this shell: "
            "a nested `gpuwarden run` or `gpuwarden.lease()` uses them; reserve more "
            "from outside it"
        )
    assert isinstance(held, holding.HeldHere)
    if seconds is not None:
        until = time.time() + seconds  # shown to others; the holder times itself by boottime
    lease = held.held
    what = COMMAND + (f" --for {args.duration}" if args.duration else "")
    sys.stdout.flush()  # the holder is a fork: nothing buffered may be written twice
    sys.stderr.flush()
    pid = hold_in_background(lease, what, expires=until, seconds=seconds)
    use_uuid = conf.get("run.id_format") == "uuid"
    env = launch.job_env({}, lease.gpus, use_uuid=use_uuid, mem=lease.mem)
    env["GPUWARDEN_RESERVATION"] = lease.job
    for name in _EXPORTED:
        if name in env:
            print(f"export {name}={_quote(env[name])}")
    ids = ",".join(str(g.index) for g in lease.gpus)
    end = "until released" if until is None else "until " + _when(until)
    print(
        f"gpuwarden reserve: holding GPU {ids} {end} (reservation {lease.job}, holder pid {pid}); "
        "end it with `gpuwarden release`",
        file=sys.stderr,
    )
    return 0


def _when(at: float) -> str:
    """A local time to read at a glance: the clock time today, with the date otherwise."""
    local = time.localtime(at)
    same_day = time.localtime()[:3] == local[:3]
    return time.strftime("%H:%M" if same_day else "%Y-%m-%d %H:%M", local)


def _mine(leases: list[Any]) -> dict[str, list[Any]]:
    from gpuwarden.paths import user_name

    me = user_name(os.geteuid())
    out: dict[str, list[Any]] = {}
    for info in leases:
        if info.job and info.job.startswith(RESERVATION_PREFIX) and info.user == me:
            out.setdefault(info.job, []).append(info)
    return out


def _time_hint(service: str) -> str:
    """` --time T` where the service holds this user to a longest time for an
    interactive job (which it then requires), else "": the hint must be a command the
    service accepts."""
    from gpuwarden.queueclient.client import connect

    try:
        client = connect(service, timeout=2.0)
        if client is None:
            return ""
        with client:
            limits = client.call("limits")["limits"]
    except (UserError, OSError, KeyError, ValueError):
        return ""
    from gpuwarden.units import format_span

    longest = {row.get("limit"): row["value"] for row in limits}
    most = longest.get("max_interactive_time") or longest.get("max_time")
    return f" --time {format_span(most)}" if most else ""


def release(args: argparse.Namespace) -> int:
    import gpuwarden.leases as lease

    leases = lease.list_leases()
    wanted = args.id if args.id is not None else os.environ.get("GPUWARDEN_RESERVATION")
    if wanted is not None and not wanted.strip():
        raise UserError("empty reservation ID: name one (see `gpuwarden status`) or give none")
    if wanted is None:
        mine = _mine(leases)
        if not mine:
            raise UserError("you hold no reservation (see `gpuwarden status`)")
        if len(mine) > 1:
            raise UserError("you hold several reservations; name one: " + ", ".join(sorted(mine)))
        wanted = next(iter(mine))
    from gpuwarden.safefiles import printable

    found = [i for i in leases if i.job == wanted and i.pid > 0]
    if not found and os.environ.get("GPUWARDEN_RESERVATION") == wanted:
        # Released before without `eval`: this shell still names it. The unset line
        # lets `eval "$(gpuwarden release)"` clear what is left.
        print("unset " + " ".join(_EXPORTED))
        print(
            f"gpuwarden release: reservation {printable(wanted)} has ended already; "
            "its variables are cleared by eval",
            file=sys.stderr,
        )
        return 0
    if not found:
        raise UserError(
            f"no reservation {printable(repr(wanted))} is held (it may have ended or expired)"
        )
    from gpuwarden.paths import user_name

    me = user_name(os.geteuid())
    if found[0].user != me and os.geteuid() != 0:
        raise UserError(f"reservation {wanted} belongs to {found[0].user}, not to {me}")
    from gpuwarden import holders
    from gpuwarden.locations import lease_location

    target = holders.prove_holder(lease_location(), found[0], f"reservation {wanted}")
    pid = target.pid
    try:
        target.send(signal.SIGTERM)
    finally:
        target.close()
    deadline = time.monotonic() + 5
    while any(i.job == wanted for i in lease.list_leases()):
        if time.monotonic() > deadline:
            raise UserError(f"reservation {wanted}: holder pid {pid} did not stop")
        time.sleep(0.02)
    if os.environ.get("GPUWARDEN_RESERVATION") == wanted:
        print("unset " + " ".join(_EXPORTED))
    ids = ",".join(str(i.index) for i in found if i.index is not None)
    print(f"gpuwarden release: released GPU {ids} (reservation {wanted})", file=sys.stderr)
    return 0
