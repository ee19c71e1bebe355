"""Holding GPUs for every face: one decision, one typed answer.

    hold(request, conf, face) -> OnCpu | ByService | Enclosed | Held | Planned

`gpuwarden run`, `gpuwarden.lease()`, the kernel provisioner and `gpuwarden reserve`
ask `hold`, and only `hold` decides, in this order:

1. the CPU (`OnCpu`): no GPU asked for (-g 0), or no NVIDIA driver and no GPU asked
   for by number or name (the same command on a laptop and on the server);
2. the queue service (`ByService`), where one owns this machine's GPUs and we are
   not inside one of its jobs already (that job runs on its own GPUs);
3. an enclosing lease of ours (`Enclosed`): inside a `reserve` shell, a `run` job or
   a service job, its GPUs under its lease, nothing new taken;
4. a lease taken here (`leases.Held`, its allocation lock held until it is
   published), waiting in line as the face asks.

What a face does with the answer is its own: `run` starts its job (the service's
start where the service holds), `lease()` yields the GPUs to its block, the kernel
provisioner starts the kernel, `reserve` leaves a holder behind. The order that keeps
a lease honest — prepare the record, start, publish, kill a job that could not be
published — is `start_published`, for `run` and the queue service's placing alike.
"""

from __future__ import annotations

import os

from gpuwarden.base.errors import UserError

TYPE_CHECKING = False  # annotations only: the run path does not import typing
if TYPE_CHECKING:
    from collections.abc import Callable, Collection, Mapping, Sequence
    from typing import Optional, Protocol, TypeVar, Union

    from gpuwarden.config import Config
    from gpuwarden.leases import Held
    from gpuwarden.machine.inventory import Gpu, Snapshot
    from gpuwarden.placement.request import Request

    class Started(Protocol):
        """A started job: `run`'s child, or the service's supervised job."""

        @property
        def pid(self) -> int: ...

    S = TypeVar("S", bound=Started)
    Reader = Callable[[], Snapshot]
    Taker = Callable[["MachineReader", Optional[Sequence[str]]], Held]
    #: What a dry run would take: the machine as read (None: the job would run with
    #: every GPU hidden) and the GPUs a parent CUDA_VISIBLE_DEVICES leaves (None: all);
    #: nothing taken. A tuple, not a class: every class made at import is paid by
    #: every `run`.
    Planned = tuple[Optional[Snapshot], Optional[Sequence[str]]]
    Holding = Union["OnCpu", "ByService", "Enclosed", Held, Planned]


class Face:
    """How one face asks: `name` (what a line it prints starts with), the environment
    it runs in (`environ`: its CUDA_VISIBLE_DEVICES limits the choice, its
    GPUWARDEN_JOB or GPUWARDEN_RESERVATION name an enclosing lease), how it reads the
    machine (`read`, None: NVML or the simulator), how it leases here (`take`, None:
    `allocation.acquire` with `wait` and `timeout`, silently; the command line shows
    its wait), `use_uuid` (CUDA_VISIBLE_DEVICES by UUID), `plan_only` (decide, take
    nothing: `run --dry-run`) and `without_service` (a refusal where no queue service
    holds the GPUs: `run --time`, which only the service enforces)."""

    def __init__(
        self,
        name: str,
        environ: Optional[Mapping[str, str]] = None,
        *,
        read: Optional[Reader] = None,
        take: Optional[Taker] = None,
        wait: bool = False,
        timeout: Optional[float] = None,
        use_uuid: bool = False,
        plan_only: bool = False,
        without_service: Optional[str] = None,
    ) -> None:
        self.name = name
        self.environ: Mapping[str, str] = os.environ if environ is None else environ
        self.read = read
        self.take = take
        self.wait = wait
        self.timeout = timeout
        self.use_uuid = use_uuid
        self.plan_only = plan_only
        self.without_service = without_service
        #: The machine as `hold` first read it, where it leased here (what the job's
        #: device cgroup is made from).
        self.machine: Optional[MachineReader] = None


class OnCpu:
    """No GPU: every GPU hidden (CUDA_VISIBLE_DEVICES=""), without a lease. `reason` is
    why where it was not asked for (no NVIDIA driver here), else None."""

    kind = "cpu"

    def __init__(self, reason: Optional[str] = None) -> None:
        self.reason = reason


class ByService:
    """The queue service at `socket` holds this machine's GPUs: it leases them for us."""

    kind = "service"

    def __init__(self, socket: str) -> None:
        self.socket = socket


class Enclosed:
    """GPUs a nested job or block gets from an enclosing lease of ours: `gpus`, the
    enclosing lease's `job`, and the environment (`env`, from the caller's) that keeps
    that lease's GPUWARDEN_JOB, GPUWARDEN_LEASE and GPUWARDEN_MEM_LIMIT: nothing new is
    taken, so there is nothing to release either."""

    kind = "enclosing"

    def __init__(self, gpus: tuple[Gpu, ...], job: str, env: dict[str, str]) -> None:
        self.gpus = gpus
        self.job = job
        self.env = env

    @property
    def mem(self) -> Optional[int]:
        """The enclosing lease's declared share in bytes (None: whole GPUs)."""
        limit = self.env.get("GPUWARDEN_MEM_LIMIT")
        return int(limit) if limit and limit.isdigit() else None


def hold(request: Request, conf: Config, face: Face) -> Holding:
    """Decide, once, where `request`'s GPUs come from (the module's text), and take them
    where that is this process: `conf` is the face's one reading of the configuration
    (nothing below reads it again)."""
    decision = decide(request, conf, face)
    if not isinstance(decision, MachineReader):
        return decision
    scope = allowed(decision.first, face.environ)
    if face.take is not None:
        held = face.take(decision, scope)
    else:
        from gpuwarden.jobs.allocation import acquire

        held = acquire(
            request,
            snapshot=decision,
            wait=face.wait,
            timeout=face.timeout,
            allowed=scope,
            conf=conf,
        )
    face.machine = decision
    return held


def decide(
    request: Request, conf: Config, face: Face
) -> Union[OnCpu, ByService, Enclosed, Planned, MachineReader]:
    """`hold`'s decision, before anything is taken: a `MachineReader` (its first
    reading kept) where this process is to lease."""
    if request.count == 0:
        if request.mem is not None:
            raise UserError(
                "--mem asks for a share of a GPU; it cannot be combined with -g 0/--cpu"
            )
        return OnCpu()
    socket = None if face.plan_only else service_socket(conf, face.environ)
    if socket is not None:
        return ByService(socket)
    if face.without_service is not None:
        raise UserError(face.without_service)
    machine = MachineReader(topology=request.gpu_count > 1, read=face.read)
    first = machine.first
    if not first.gpus and first.error and defaulted(request, conf):
        return OnCpu(str(first.error))
    scope = allowed(first, face.environ)
    if face.plan_only:
        return (first, scope)
    enclosed = within_enclosing(first, request, scope, face.environ, conf, face.use_uuid)
    return machine if enclosed is None else enclosed


def defaulted(request: Request, conf: Config) -> bool:
    """No -g, --gpus or --mem, and no configured count or GPU list: "1 GPU" is a default."""
    keys = ("run.count", "run.gpus")
    return request.mem is None and all(conf.source(k) == "default" for k in keys)


def service_at(path: Optional[str]) -> Optional[str]:
    """`path` where a queue service's socket is there, else None."""
    return str(path) if path and os.path.exists(path) else None


def service_socket(conf: Config, environ: Optional[Mapping[str, str]] = None) -> Optional[str]:
    """The queue service's socket where one owns this machine's GPUs, or None: then this
    process leases them itself. Inside one of the service's jobs (GPUWARDEN_JOB) there
    is no asking again: that job runs on its own GPUs already."""
    env = os.environ if environ is None else environ
    if "GPUWARDEN_JOB" in env:
        return None
    return service_at(conf.service_socket())


class MachineReader:
    """Reads the machine for selection: the first reading is kept for the parent
    CUDA_VISIBLE_DEVICES check and the first attempt; later attempts read afresh."""

    def __init__(self, topology: bool, read: Optional[Callable[..., Snapshot]] = None) -> None:
        if read is None:
            self._read: Callable[..., Snapshot] = _read_machine
            self.first = _read_machine(processes=True, topology=topology)
        else:
            self._read = read
            self.first = read()
        self._topology = topology
        self._fresh = True
        self._given = read is not None

    def __call__(self) -> Snapshot:
        if self._fresh:
            self._fresh = False
            return self.first
        if self._given:
            return self._read()
        return self._read(processes=True, topology=self._topology)


def _read_machine(processes: bool, topology: bool) -> Snapshot:
    from gpuwarden.machine.inventory import read_snapshot

    # `detail=False`: what the choice decides on, not what `status` shows
    return read_snapshot(processes=processes, topology=topology, detail=False)


def allowed(
    snapshot: Snapshot, environ: Optional[Mapping[str, str]] = None
) -> Optional[tuple[str, ...]]:
    """The GPUs a parent CUDA_VISIBLE_DEVICES leaves to us (None: unset, all of them).
    The reading side (`visible`) is loaded only when the variable is set."""
    env = os.environ if environ is None else environ
    if "CUDA_VISIBLE_DEVICES" not in env:
        return None
    from gpuwarden.placement.visible import allowed_uuids

    return allowed_uuids(snapshot, env)


def within_enclosing(
    snapshot: Snapshot,
    request: Request,
    allowed: Optional[Collection[str]],
    environ: Optional[Mapping[str, str]] = None,
    conf: Optional[Config] = None,
    use_uuid: bool = False,
) -> Optional[Enclosed]:
    """Inside a shell set up by `gpuwarden reserve` (GPUWARDEN_RESERVATION), or inside a
    job started by `gpuwarden run` or the service (GPUWARDEN_JOB), a nested job or
    block runs on those GPUs under the enclosing lease instead of waiting for it to
    end. None when there is no live enclosing lease of ours. `use_uuid`: name the GPUs
    by UUID in CUDA_VISIBLE_DEVICES."""
    env = os.environ if environ is None else environ
    enclosing = [e for e in (env.get("GPUWARDEN_RESERVATION"), env.get("GPUWARDEN_JOB")) if e]
    if not enclosing:
        return None
    from gpuwarden import leases
    from gpuwarden.files.locations import lease_location, state_location
    from gpuwarden.files.paths import user_name
    from gpuwarden.health.drain import list_drains
    from gpuwarden.health.xidlog import judged
    from gpuwarden.jobs.launch import job_env
    from gpuwarden.placement.selection import choose

    held = leases.list_leases(lease_location(conf))
    me = user_name(os.geteuid())
    for rid in enclosing:
        ours = {i.uuid for i in held if i.job == rid and i.user == me}
        if not ours:
            continue  # ended or expired: lease normally
        scope = ours if allowed is None else ours & set(allowed)
        others = [i for i in held if i.job != rid]
        drains = list_drains(state_location(conf))
        choice = choose(snapshot, request, others, drains, scope, judged(snapshot.gpus, conf=conf))
        if not choice.ok:
            raise UserError(f"within {rid}: {choice.error}")
        inner = job_env(env, choice.gpus, use_uuid=use_uuid)
        for name in ("GPUWARDEN_JOB", "GPUWARDEN_LEASE", "GPUWARDEN_MEM_LIMIT"):
            if name in env:  # still under the enclosing job's lease
                inner[name] = env[name]
        return Enclosed(tuple(choice.gpus), str(rid), inner)
    return None


def start_published(
    held: Held,
    command: str,
    start: Callable[[], S],
    kill: Callable[[S], object],
    before_start: Optional[Callable[[], None]] = None,
    expires: Optional[float] = None,
) -> S:
    """Start a job holding `held` and publish it as the lease's job, in the one order
    that keeps leases honest: the record is prepared first (a full disk fails here,
    nothing started); `before_start` (a device cgroup, say) runs next; then `start`.
    On any failure the lease is released, and a job that started but could not be
    published is killed (`kill`) first: a job must never run under a lease others
    cannot see."""
    try:
        held.prepare(command, expires=expires)
        if before_start is not None:
            before_start()
        job = start()
    except BaseException:
        held.release()
        raise
    try:
        held.publish(job.pid)
    except BaseException:
        try:
            kill(job)
        finally:
            held.release()
        raise
    return job


def kill_group(pid: int) -> bool:
    """SIGKILL the job's process group; False when it is gone already."""
    import signal  # here, not at the top: only a failed start pays for its enums

    try:
        os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:
        return False
    return True


def publish_here(held: Held, command: str) -> None:
    """Publish `held` as this process's own lease (the Python API's `with` block)."""
    try:
        held.publish(os.getpid(), command)
    except BaseException:
        held.release()
        raise
