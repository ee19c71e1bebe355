"""The one path from a request to a running job and back, every decision on it made once.

    request -> read the machine -> choose -> lease -> launch -> publish -> ... -> release

`gpuwarden run` parses its options into `start` and prints what comes back;
`gpuwarden reserve`, `gpuwarden.lease()`, the kernel provisioner and the queue
service take their GPUs through the same steps (`gpuwarden.lease()` asks
`service_socket` the same question of service or direct). `start` decides: the
CPU (-g 0, or no driver and no GPU asked for), the queue service (it leases and
starts the job on our terminal), an enclosing lease (a `reserve` shell, a `run`
job), or this process leasing, with the device cgroup, the DDP ranks and
environment, and containers on the way.

The order that keeps leases honest is written once: the lease record is prepared
before the job starts (a full disk fails before anything runs), a job never runs
under a lease others cannot see (it is killed if publishing fails), and every
failure on the way releases what was taken. Choosing is `selection`, waiting in
line `jobs.allocation`, the locks `leases`, the child process `jobs.launch`.
"""

from __future__ import annotations

import os
import signal
import sys

from gpuwarden.errors import UserError

TYPE_CHECKING = False  # annotations only: the run path does not import typing
if TYPE_CHECKING:
    from collections.abc import Callable, Collection, Mapping, Sequence
    from typing import Any, Optional

    from gpuwarden.jobs.launch import StartedJob
    from gpuwarden.leases import Held


def service_socket(conf: Any, environ: Optional[Mapping[str, str]] = None) -> Optional[str]:
    """The queue service's socket where one owns this machine's GPUs, or None: then this
    process leases them itself. Inside one of the service's jobs (GPUWARDEN_JOB) there
    is no asking again: that job runs on its own GPUs already."""
    env = os.environ if environ is None else environ
    path = conf.get("service.socket")
    if not path or "GPUWARDEN_JOB" in env or not os.path.exists(path):
        return None
    return str(path)


class MachineReader:
    """Reads the machine for selection: the first reading is kept for the parent
    CUDA_VISIBLE_DEVICES check and the first attempt; later attempts read afresh."""

    def __init__(self, topology: bool, read: Optional[Callable[..., Any]] = None) -> None:
        if read is None:
            from gpuwarden.inventory import read_snapshot

            def read(**how: Any) -> Any:
                return read_snapshot(detail=False, **how)  # what the choice decides on

        self._read = read
        self._topology = topology
        self.first = read(processes=True, topology=topology)
        self._fresh = True

    def __call__(self) -> Any:
        if self._fresh:
            self._fresh = False
            return self.first
        return self._read(processes=True, topology=self._topology)


def allowed(snapshot: Any, environ: Optional[Mapping[str, str]] = None) -> Optional[Sequence[str]]:
    """The GPUs a parent CUDA_VISIBLE_DEVICES leaves to us (None: unset, all of them).
    The reading side (`visible`) is loaded only when the variable is set."""
    env = os.environ if environ is None else environ
    if "CUDA_VISIBLE_DEVICES" not in env:
        return None
    from gpuwarden.visible import allowed_uuids

    return allowed_uuids(snapshot, env)


def launch_leased(
    held: Held,
    argv: Sequence[str],
    env: Mapping[str, str],
    command: str,
    before_start: Optional[Callable[[], None]] = None,
    start: Optional[Callable[[Sequence[str], Mapping[str, str], Sequence[int]], StartedJob]] = None,
) -> StartedJob:
    """Start `argv` holding `held`'s descriptors and publish it as the lease's job.

    The record is prepared first (a full disk fails here, nothing started);
    `before_start` (a device cgroup, say) runs next; `start` replaces `launch.start` (a
    container's client, gpuwarden.containers). On any failure the lease is
    released, and a job that started but could not be published is killed: a job
    must never run under a lease others cannot see."""
    from gpuwarden.jobs import launch

    try:
        held.prepare(command)
        if before_start is not None:
            before_start()
        job = (start or launch.start)(argv, env, held.fds)
    except BaseException:
        held.release()
        raise
    try:
        held.publish(job.pid)
    except BaseException:
        try:
            os.killpg(job.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        job.wait()
        held.release()
        raise
    return job


def publish_here(held: Held, command: str) -> None:
    """Publish `held` as this process's own lease (the Python API's `with` block)."""
    try:
        held.publish(os.getpid(), command)
    except BaseException:
        held.release()
        raise


class Enclosed:
    """GPUs a nested job or block gets from an enclosing lease of ours: `gpus`, the
    enclosing lease's `job`, and the environment (`env`, from the caller's) that keeps
    that lease's GPUWARDEN_JOB, GPUWARDEN_LEASE and GPUWARDEN_MEM_LIMIT: nothing new is
    taken, so there is nothing to release either."""

    def __init__(self, gpus: tuple[Any, ...], job: str, env: dict[str, str]) -> None:
        self.gpus = gpus
        self.job = job
        self.env = env


def within_enclosing(
    snapshot: Any,
    request: Any,
    allowed: Optional[Collection[str]],
    environ: Optional[Mapping[str, str]] = None,
    conf: Any = None,
    use_uuid: bool = False,
) -> Optional[Enclosed]:
    """Inside a shell set up by `gpuwarden reserve` (GPUWARDEN_RESERVATION), or inside a
    job started by `gpuwarden run` (GPUWARDEN_JOB), a nested job (`run`) or block
    (`gpuwarden.lease()`) runs on those GPUs under the enclosing lease instead of waiting
    for it to end. None when there is no live enclosing lease of ours. `conf`: the
    caller's reading of the configuration (None: the one in force); `use_uuid`: name
    the GPUs by UUID in CUDA_VISIBLE_DEVICES."""
    env = os.environ if environ is None else environ
    enclosing = [env.get(n) for n in ("GPUWARDEN_RESERVATION", "GPUWARDEN_JOB")]
    enclosing = [e for e in enclosing if e]
    if not enclosing:
        return None
    from gpuwarden import leases
    from gpuwarden.drain import list_drains
    from gpuwarden.health.xidlog import judged
    from gpuwarden.jobs.launch import job_env
    from gpuwarden.locations import lease_location, state_location
    from gpuwarden.paths import user_name
    from gpuwarden.selection import choose

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


class DryRun:
    """What a dry run would do: choose on `snapshot` within `allowed` (`snapshot` None:
    the job would run with every GPU hidden)."""

    def __init__(self, snapshot: Any = None, allowed: Optional[Sequence[str]] = None) -> None:
        self.snapshot = snapshot
        self.allowed = allowed


class HeldJob:
    """A job `start` started, with what it holds for it (a lease, device cgroups), or the
    exit status of one already over (the queue service ran it on our terminal)."""

    def __init__(
        self, job: Any = None, held: Any = None, isolation: Sequence[Any] = (), code: int = 0
    ) -> None:
        self.job = job
        self.held = held
        self.isolation = isolation
        self.code = code

    def wait(self) -> int:
        """Wait for the job, then free what it held: its exit status."""
        try:
            if self.job is None:
                return self.code
            try:
                return self.job.wait()
            finally:
                if self.held is not None:
                    self.held.release()
        finally:
            self.close()

    def close(self) -> None:
        for cgroup in self.isolation:
            cgroup.close()


def start(
    request: Any,
    cmd: Sequence[str],
    conf: Any,
    *,
    ddp: bool = False,
    nproc: Optional[int] = None,
    dry_run: bool = False,
    time_limit: Optional[str] = None,
    warning: Optional[Callable[[], Optional[dict[str, Any]]]] = None,
    take: Optional[Callable[[MachineReader, Any], Held]] = None,
    say: Optional[Callable[[str], None]] = None,
) -> HeldJob | DryRun:
    """Start `cmd` for `request` the way `gpuwarden run` does, deciding everything on
    the way: a `HeldJob` (the job with what it holds), or a `DryRun` for a dry run.

    `conf` is the one reading of the configuration everything on the way is handed
    (nothing below reads it again): the waiting (run.wait, run.timeout), the id format,
    the service's socket and reconnection, the device cgroup setting, where leases,
    drains and XID logs are, and the health rules. `warning` reads `--signal` for the
    service (only there: without one it has no meaning); `take` leases on the direct
    path (default: `allocation.acquire`, silently; the command line shows its wait);
    `say` tells why the job runs with no GPU (default: standard error)."""
    if say is None:

        def say(line: str) -> None:
            print(line, file=sys.stderr)

    def on_cpu() -> HeldJob | DryRun:
        """Every GPU hidden (CUDA_VISIBLE_DEVICES=""), without a lease."""
        from gpuwarden.jobs import launch

        if dry_run:
            return DryRun()
        argv = launch.ddp_argv(cmd, nproc or 1) if ddp else list(cmd)
        env = launch.job_env(os.environ, ())
        if ddp:
            env["GPUWARDEN_DDP_BACKEND"] = "gloo"
        return HeldJob(launch.start(argv, env), isolation=isolation)

    isolation: list[Any] = []  # the job's device cgroup, when gpuwarden.cgroups.devices made one
    try:
        if request.count == 0:
            if request.mem is not None:
                raise UserError(
                    "--mem asks for a share of a GPU; it cannot be combined with -g 0/--cpu"
                )
            return on_cpu()
        service = None if dry_run else service_socket(conf)
        if service is not None:
            return HeldJob(code=_through_service(request, cmd, conf, ddp, time_limit, warning))
        if time_limit is not None:
            raise UserError(
                f"--time needs the queue service (none answers at "
                f"{conf.get('service.socket')}) or --slurm; "
                "without them a job runs until it ends"
            )
        # Only the direct path chooses, leases and launches here (not the service's).
        devices = conf.get("enforce.devices")  # a device cgroup for the job, as root
        if not dry_run and devices != "off" and (os.geteuid() == 0 or devices == "require"):
            from gpuwarden.cgroups.devices import isolate

            isolation.extend(isolate(devices))
        machine = MachineReader(topology=request.gpu_count > 1)
        first = machine.first
        if not first.gpus and first.error and _gpus_defaulted(request, conf):
            # The same command on a laptop and on the server: with no NVIDIA driver and
            # no GPU asked for by name or number, the job runs on the CPU (documented).
            say(
                f"gpuwarden run: {first.error}: the job runs with no GPU "
                "(-g N would refuse instead)"
            )
            return on_cpu()
        scope = allowed(first)
        if dry_run:
            return DryRun(first, scope)
        return _direct(request, cmd, conf, machine, scope, ddp, nproc, take, devices, isolation)
    except BaseException:
        for cgroup in isolation:
            cgroup.close()
        raise


def _gpus_defaulted(request: Any, conf: Any) -> bool:
    """No -g, --gpus or --mem, and no configured count or GPU list: "1 GPU" is a default."""
    keys = ("run.count", "run.gpus")
    return request.mem is None and all(conf.source(k) == "default" for k in keys)


def _through_service(
    request: Any,
    cmd: Sequence[str],
    conf: Any,
    ddp: bool,
    time_limit: Optional[str],
    warning: Optional[Callable[[], Optional[dict[str, Any]]]],
) -> int:
    """With a queue service on this machine, the service leases the GPUs and starts the
    job, as us and on our terminal (docs/service.md): no user who holds the shared lock
    files can block it, and it takes its turn by priority and fair share."""
    from gpuwarden.jobs import launch
    from gpuwarden.queueclient.client import job_fields, run_attached
    from gpuwarden.units import parse_time_limit

    argv = launch.ddp_argv(cmd, request.gpu_count) if ddp else list(cmd)
    if not ddp:
        from gpuwarden.containers.command import through_service

        argv = through_service(argv, os.environ.get("GPUWARDEN_DEV_DIR"))
    limit = None if time_limit is None else parse_time_limit(time_limit)
    fields = job_fields(
        request,
        argv,
        time_limit=limit,
        warning=None if warning is None else warning(),
        account=conf.get("submit.account"),
    )
    fields["wait"] = bool(conf.get("run.wait"))
    return run_attached(
        fields,
        conf.get("service.socket"),
        timeout=conf.get("run.timeout"),
        reconnect=float(conf.get("service.reconnect")),
    )


def _direct(
    request: Any,
    cmd: Sequence[str],
    conf: Any,
    machine: MachineReader,
    scope: Optional[Sequence[str]],
    ddp: bool,
    nproc: Optional[int],
    take: Optional[Callable[[MachineReader, Any], Held]],
    devices: str,
    isolation: list[Any],
) -> HeldJob:
    """This process chooses, leases and launches (no queue service)."""
    from gpuwarden.jobs import launch

    use_uuid = conf.get("run.id_format") == "uuid"
    backend = {"GPUWARDEN_DDP_BACKEND": "nccl"} if ddp else {}
    enclosed = within_enclosing(machine.first, request, scope, conf=conf, use_uuid=use_uuid)
    if enclosed is not None:
        covered = enclosed.gpus
        argv = launch.ddp_argv(cmd, len(covered)) if ddp else list(cmd)
        env = enclosed.env
        env.update(backend)
        inner = _container(argv, covered, env.get("GPUWARDEN_JOB"), (), env)
        if inner is not None:  # the enclosing lease holds the GPUs: nothing to pass in
            from gpuwarden.containers.runtime import start as start_container

            return HeldJob(start_container(inner, env, ()), isolation=isolation)
        return HeldJob(launch.start(argv, env), isolation=isolation)
    if take is None:
        from gpuwarden.jobs.allocation import acquire

        held = acquire(
            request,
            snapshot=machine,
            wait=bool(conf.get("run.wait")),
            timeout=conf.get("run.timeout"),
            allowed=scope,
            conf=conf,
        )
    else:
        held = take(machine, scope)
    try:
        argv = list(cmd)
        if ddp:
            if nproc is not None and nproc != len(held.gpus):
                raise UserError(
                    f"--nproc {nproc} with {len(held.gpus)} GPU(s): --ddp runs one rank "
                    "per GPU; ask for -g N instead (or --cpu --nproc N)"
                )
            argv = launch.ddp_argv(cmd, len(held.gpus))
        env = launch.job_env(os.environ, held.gpus, use_uuid=use_uuid, job=held.job, mem=held.mem)
        env.update(backend)
        container = _container(argv, held.gpus, held.job, held.fds, env)
    except BaseException:
        held.release()
        raise
    started = HeldJob(held=held, isolation=isolation)

    def confine() -> None:
        if not started.isolation:
            return
        from gpuwarden.cgroups.devices import confine

        for cgroup in started.isolation:
            confine(cgroup, held.gpus, machine.first.gpus, devices)

    starter = None
    if container is not None:
        from gpuwarden.containers.runtime import start as start_container

        argv = container.argv

        def starter(_argv: Any, env: Any, fds: Any) -> Any:
            return start_container(container, env, fds)

    started.job = launch_leased(held, argv, env, launch.command_text(cmd), confine, starter)
    return started


def _container(argv: list[str], gpus: Any, job: Any, fds: Any, env: dict[str, str]) -> Any:
    """The container command rewritten for a lease on `gpus` whose descriptors are `fds`
    (docs/containers.md), or None when `argv` starts no container."""
    from gpuwarden.containers.command import plan_here

    dev = os.environ.get("GPUWARDEN_DEV_DIR", "/dev")
    return plan_here(argv, gpus, job, len(fds), env, dev)
