"""`gpuwarden reserve` / `gpuwarden release`: hold GPUs for an interactive session.

    eval "$(gpuwarden reserve -g 1 --for 4h)"   # this shell now uses the GPU
    jupyter lab                                 # ... work ...
    eval "$(gpuwarden release)"                 # give it back, unset the variables

The lease is held by a small detached holder process (a fork of this one,
in its own session, with no terminal), so it outlives `reserve` and the shell
that ran it, ends when `release` (or `kill`) stops the holder or `--for`
runs out, and the kernel frees it whichever way the holder goes. Where a queue
service owns the GPUs, the holder keeps an allocation of the service instead
(`_through_service`), with `--for` as its time limit.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from typing import Any, Optional

from gpuwarden.base.errors import UserError

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
#: Exported as well under a queue service, as a job's: `run` in the shell uses its GPUs.
_JOB = ("GPUWARDEN_JOB", "GPUWARDEN_LEASE")


def register(commands: Commands, command_name: str) -> None:
    from gpuwarden.cli import subcommand

    parser = subcommand(commands, command_name)
    if command_name == "reserve":
        from gpuwarden.jobs.options import add_lease_options

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
    from gpuwarden.cli.waiting import take
    from gpuwarden.jobs import holding, launch
    from gpuwarden.jobs.holder import hold_in_background
    from gpuwarden.jobs.options import request_of

    args.cpu = False
    conf, request = request_of(args)
    if request.count == 0:
        raise UserError("-g 0 reserves nothing; ask for 1 or more GPUs")
    seconds = _seconds(args.duration)
    job = RESERVATION_PREFIX + os.urandom(4).hex()

    def taking(machine: holding.MachineReader, scope: Any) -> Any:
        return take("reserve", conf, request, machine, scope, job)

    held = holding.hold(request, conf, holding.Face("reserve", take=taking))
    if isinstance(held, holding.ByService):
        return _through_service(args, conf, request, held.socket, seconds)
    if isinstance(held, holding.OnCpu):
        raise UserError(f"{held.reason}: there is no GPU here to reserve")
    if isinstance(held, holding.Enclosed):
        ids = ",".join(str(g.index) for g in held.gpus)
        raise UserError(
            f"already inside {held.job}, whose lease holds GPU {ids} for this shell: "
            "a nested `gpuwarden run` or `gpuwarden.lease()` uses them; reserve more "
            "from outside it"
        )
    assert not isinstance(held, tuple)  # a lease taken here
    until = None if seconds is None else time.time() + seconds  # the holder times itself
    lease = held
    what = COMMAND + (f" --for {args.duration}" if args.duration else "")
    _flush()
    pid = hold_in_background(lease, what, expires=until, seconds=seconds)
    use_uuid = conf.get("run.id_format") == "uuid"
    env = launch.job_env({}, lease.gpus, use_uuid=use_uuid, mem=lease.mem)
    env["GPUWARDEN_RESERVATION"] = lease.job
    _export(env, _EXPORTED)
    end = "until released" if until is None else "until " + _when(until)
    _held(lease.gpus, end, f"reservation {lease.job}, holder pid {pid}")
    return 0


def _seconds(duration: Optional[str]) -> Optional[float]:
    """`--for`'s seconds (None: not given)."""
    if duration is None:
        return None
    from gpuwarden.base.units import parse_duration

    seconds = parse_duration(duration)
    if seconds <= 0:
        raise UserError(f"invalid --for {duration!r}: expected a duration above zero")
    return seconds


def _flush() -> None:
    sys.stdout.flush()  # the holder is a fork: nothing buffered may be written twice
    sys.stderr.flush()


def _export(env: dict[str, str], names: tuple[str, ...]) -> None:
    for name in names:
        if name in env:
            print(f"export {name}={_quote(env[name])}")


def _held(gpus: Any, end: str, what: str) -> None:
    ids = ",".join(str(g.index) for g in gpus)
    print(
        f"gpuwarden reserve: holding GPU {ids} {end} ({what}); end it with `gpuwarden release`",
        file=sys.stderr,
    )


def _through_service(
    args: argparse.Namespace, conf: Any, request: Any, service: str, seconds: Optional[float]
) -> int:
    """The reservation as an allocation of the queue service, which owns the lease
    directory (a holder of our own could not write it), held as `gpuwarden.lease()`
    holds one (queueclient.holding) by a detached holder (jobs.holder): a job of
    ours in `queue`, limited and charged like any, `--for` its time limit (the
    admin's rule for interactive holds applies), ended by `release` (a cancel), by
    its time, or by the holder's death. Its id is the reservation's; the shell also
    gets GPUWARDEN_JOB, so `run` inside it uses its GPUs, as inside a job."""
    from gpuwarden.jobs import launch
    from gpuwarden.jobs.holder import hold_allocation_in_background
    from gpuwarden.machine.inventory import read_snapshot
    from gpuwarden.queueclient import holding
    from gpuwarden.queueclient.client import job_fields

    fields = job_fields(
        request,
        holding.RESERVATION,
        time_limit=seconds,
        account=conf.get("submit.account"),
    )
    _flush()
    pid, job, uuids = hold_allocation_in_background(
        fields,
        service,
        conf,
        wait=bool(conf.get("run.wait")),
        timeout=conf.get("run.timeout"),
        time_option="`gpuwarden reserve --for`",
    )
    by_uuid = {g.uuid: g for g in read_snapshot(processes=False).gpus}
    gpus = tuple(by_uuid[u] for u in uuids if u in by_uuid)
    use_uuid = conf.get("run.id_format") == "uuid"
    env = launch.job_env({}, gpus, use_uuid=use_uuid, job=str(job), mem=request.mem)
    env["GPUWARDEN_RESERVATION"] = str(job)
    _export(env, _EXPORTED + _JOB)
    limit = seconds if seconds is not None else _time_limit(service, job)
    end = "until released" if limit is None else "until " + _when(time.time() + limit)
    _held(gpus, end, f"reservation {job}: a job of the queue service, holder pid {pid}")
    return 0


def _time_limit(service: str, job: int) -> Optional[float]:
    """The time limit the service gave a job that asked for none (its
    `interactive_time`); None where it gave none, or does not say."""
    from gpuwarden.queueclient.client import connect

    try:
        client = connect(service, timeout=5.0)
        if client is None:
            return None
        with client:
            rows, _ = client.listing("queue", ids=[job])
    except (UserError, OSError):
        return None
    limit = rows[0].get("time_limit") if rows else None
    return float(limit) if isinstance(limit, (int, float)) else None


def _when(at: float) -> str:
    """A local time to read at a glance: the clock time today, with the date otherwise."""
    local = time.localtime(at)
    same_day = time.localtime()[:3] == local[:3]
    return time.strftime("%H:%M" if same_day else "%Y-%m-%d %H:%M", local)


def _mine(leases: list[Any]) -> dict[str, list[Any]]:
    from gpuwarden.files.paths import user_name

    me = user_name(os.geteuid())
    out: dict[str, list[Any]] = {}
    for info in leases:
        if info.job and info.job.startswith(RESERVATION_PREFIX) and info.user == me:
            out.setdefault(info.job, []).append(info)
    return out


def release(args: argparse.Namespace) -> int:
    import gpuwarden.leases as lease

    wanted = args.id if args.id is not None else os.environ.get("GPUWARDEN_RESERVATION")
    if wanted is not None and not wanted.strip():
        raise UserError("empty reservation ID: name one (see `gpuwarden status`) or give none")
    from gpuwarden import config
    from gpuwarden.files.locations import lease_location

    reading = config.load()  # once: the service's socket and the lease directory
    service = reading.service_socket()
    if os.path.exists(service) and (wanted is None or not wanted.startswith(RESERVATION_PREFIX)):
        return _release_through_service(service, wanted)
    lease_dir = lease_location(reading)
    leases = lease.list_leases(lease_dir)
    if wanted is None:
        mine = _mine(leases)
        if not mine:
            raise UserError("you hold no reservation (see `gpuwarden status`)")
        if len(mine) > 1:
            raise UserError("you hold several reservations; name one: " + ", ".join(sorted(mine)))
        wanted = next(iter(mine))
    from gpuwarden.files.safefiles import printable

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
    from gpuwarden.files.paths import user_name

    me = user_name(os.geteuid())
    if found[0].user != me and os.geteuid() != 0:
        raise UserError(f"reservation {wanted} belongs to {found[0].user}, not to {me}")
    from gpuwarden.leases import holders

    target = holders.prove_holder(lease_dir, found[0], f"reservation {wanted}")
    pid = target.pid
    try:
        target.send(signal.SIGTERM)
    finally:
        target.close()
    deadline = time.monotonic() + 5
    while any(i.job == wanted for i in lease.list_leases(lease_dir)):
        if time.monotonic() > deadline:
            raise UserError(f"reservation {wanted}: holder pid {pid} did not stop")
        time.sleep(0.02)
    if os.environ.get("GPUWARDEN_RESERVATION") == wanted:
        print("unset " + " ".join(_EXPORTED))
    ids = ",".join(str(i.index) for i in found if i.index is not None)
    print(f"gpuwarden release: released GPU {ids} (reservation {wanted})", file=sys.stderr)
    return 0


def _release_through_service(service: str, wanted: Optional[str]) -> int:
    """End a reservation held through the queue service: cancel its job (only its
    owner or an admin may), and return once the service has freed its GPUs."""
    from gpuwarden.files.safefiles import printable
    from gpuwarden.queueclient import holding
    from gpuwarden.queueclient.client import require

    with require(service) as client:
        if wanted is None:
            me = client.call("hello")["user"]
            rows, _ = client.listing("queue", user=me)
            mine = [str(r["id"]) for r in rows if holding.is_reservation(r.get("command"))]
            if not mine:
                raise UserError("you hold no reservation (see `gpuwarden queue`)")
            if len(mine) > 1:
                raise UserError("you hold several reservations; name one: " + ", ".join(mine))
            wanted = mine[0]
        if not wanted.isdigit() or len(wanted) > 18:
            raise UserError(f"no reservation {printable(repr(wanted))} is held")
        job = int(wanted)
        rows, _ = client.listing("queue", ids=[job])
        if not rows:
            if os.environ.get("GPUWARDEN_RESERVATION") == wanted:
                print("unset " + " ".join(_EXPORTED + _JOB))
                print(
                    f"gpuwarden release: reservation {job} has ended already; "
                    "its variables are cleared by eval",
                    file=sys.stderr,
                )
                return 0
            raise UserError(f"no reservation {job} is held (it may have ended or expired)")
        command = rows[0].get("command")
        if command is not None and not holding.is_reservation(command):
            raise UserError(f"job {job} is not a reservation: end it with `gpuwarden cancel {job}`")
        client.call("cancel", jobs=[job])
        deadline = time.monotonic() + 30
        while client.listing("queue", ids=[job])[0] and time.monotonic() < deadline:
            time.sleep(0.05)
    if os.environ.get("GPUWARDEN_RESERVATION") == wanted:
        print("unset " + " ".join(_EXPORTED + _JOB))
    ids = ",".join(str(i) for i in rows[0].get("indices") or () if i is not None)
    print(f"gpuwarden release: released GPU {ids} (reservation {job})", file=sys.stderr)
    return 0
