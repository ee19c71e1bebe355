"""`gpuwarden run`'s path from a request to a running job and back.

    request -> hold (jobs.holding) -> launch -> publish -> ... -> release

`gpuwarden run` parses its options into `start` and prints what comes back. Where
the GPUs come from is `jobs.holding.hold`'s decision, the one every face takes
(the CPU, the queue service, an enclosing lease, or a lease here); this module adds
what only a job started by `run` needs on the way: the device cgroup, the DDP ranks
and their environment, containers, and the queue service's attached start. The
order that keeps leases honest (prepare, start, publish, kill a job that could not
be published) is `holding.start_published`. Choosing is `selection`, waiting in line
`jobs.allocation`, the locks `leases`, the child process `jobs.launch`.
"""

from __future__ import annotations

import os
import sys

from gpuwarden.jobs import holding

TYPE_CHECKING = False  # annotations only: the run path does not import typing
if TYPE_CHECKING:
    from collections.abc import Callable, Sequence
    from typing import Any, Optional

    from gpuwarden.cgroups.devices import Isolation
    from gpuwarden.config import Config
    from gpuwarden.containers.command import Plan
    from gpuwarden.jobs.launch import StartedJob
    from gpuwarden.leases import Held
    from gpuwarden.machine.inventory import Gpu
    from gpuwarden.placement.request import Request


class HeldJob:
    """A job `start` started, with what it holds for it (a lease, device cgroups), or the
    exit status of one already over (the queue service ran it on our terminal)."""

    def __init__(
        self,
        job: Optional[StartedJob] = None,
        held: Optional[Held] = None,
        isolation: Sequence[Isolation] = (),
        code: int = 0,
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
    request: Request,
    cmd: Sequence[str],
    conf: Config,
    *,
    ddp: bool = False,
    nproc: Optional[int] = None,
    dry_run: bool = False,
    time_limit: Optional[str] = None,
    warning: Optional[Callable[[], Optional[dict[str, Any]]]] = None,
    take: Optional[holding.Taker] = None,
    say: Optional[Callable[[str], None]] = None,
) -> HeldJob | holding.Planned:
    """Start `cmd` for `request` the way `gpuwarden run` does: a `HeldJob` (the job with
    what it holds), or what a dry run would take (`holding.Planned`: the machine as
    read and the GPUs left to us).

    `conf` is the one reading of the configuration everything on the way is handed
    (nothing below reads it again): the waiting (run.wait, run.timeout), the id format,
    the service's socket and reconnection, the device cgroup setting, where leases,
    drains and XID logs are, and the health rules. `warning` reads `--signal` for the
    service (only there: without one it has no meaning); `take` leases on the direct
    path (default: `allocation.acquire`, silently; the command line shows its wait);
    `say` tells why the job runs with no GPU (default: standard error)."""
    refusal = None
    if time_limit is not None:
        refusal = (
            f"--time needs the queue service (none answers at "
            f"{conf.service_socket()}) or --slurm; "
            "without them a job runs until it ends"
        )
    use_uuid = conf.get("run.id_format") == "uuid"
    face = holding.Face(
        "run",
        take=take,
        wait=bool(conf.get("run.wait")),
        timeout=conf.get("run.timeout"),
        use_uuid=use_uuid,
        plan_only=dry_run,
        without_service=refusal,
    )
    held = holding.hold(request, conf, face)
    if isinstance(held, tuple):  # a dry run's answer
        return held
    if isinstance(held, holding.ByService):
        return HeldJob(code=_through_service(request, cmd, conf, ddp, time_limit, warning))
    if isinstance(held, holding.OnCpu) and dry_run:
        return (None, None)
    devices = conf.get("enforce.devices")  # a device cgroup for the job, as root
    isolation: list[Isolation] = []
    try:
        asked = not isinstance(held, holding.OnCpu) or held.reason is not None
        if asked and devices != "off" and (os.geteuid() == 0 or devices == "require"):
            from gpuwarden.cgroups.devices import isolate

            isolation.extend(isolate(devices))
        if isinstance(held, holding.OnCpu):
            if held.reason is not None:
                # The same command on a laptop and on the server: with no NVIDIA driver
                # and no GPU asked for by name or number, the job runs on the CPU.
                (say or _stderr)(
                    f"gpuwarden run: {held.reason}: the job runs with no GPU "
                    "(-g N would refuse instead)"
                )
            return _on_cpu(cmd, ddp, nproc, isolation)
        if isinstance(held, holding.Enclosed):
            return _enclosed(held, cmd, ddp, isolation)
        assert face.machine is not None  # read where it leased
        return _direct(held, face.machine.first.gpus, cmd, ddp, nproc, devices, use_uuid, isolation)
    except BaseException:
        for cgroup in isolation:
            cgroup.close()
        if not isinstance(held, (holding.OnCpu, holding.Enclosed)):
            held.release()  # a lease taken here
        raise


def _stderr(line: str) -> None:
    print(line, file=sys.stderr)


def _on_cpu(
    cmd: Sequence[str], ddp: bool, nproc: Optional[int], isolation: list[Isolation]
) -> HeldJob:
    """Every GPU hidden (CUDA_VISIBLE_DEVICES=""), without a lease."""
    from gpuwarden.jobs import launch

    argv = launch.ddp_argv(cmd, nproc or 1) if ddp else list(cmd)
    env = launch.job_env(os.environ, ())
    if ddp:
        env["GPUWARDEN_DDP_BACKEND"] = "gloo"
    return HeldJob(launch.start(argv, env), isolation=isolation)


def _through_service(
    request: Request,
    cmd: Sequence[str],
    conf: Config,
    ddp: bool,
    time_limit: Optional[str],
    warning: Optional[Callable[[], Optional[dict[str, Any]]]],
) -> int:
    """With a queue service on this machine, the service leases the GPUs and starts the
    job, as us and on our terminal (docs/service.md): no user who holds the shared lock
    files can block it, and it takes its turn by priority and fair share."""
    from gpuwarden.base.units import parse_time_limit
    from gpuwarden.jobs import launch
    from gpuwarden.queueclient.client import job_fields, run_attached

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
        conf.service_socket(),
        timeout=conf.get("run.timeout"),
        reconnect=float(conf.get("service.reconnect")),
    )


def _enclosed(
    enclosed: holding.Enclosed, cmd: Sequence[str], ddp: bool, isolation: list[Isolation]
) -> HeldJob:
    """The job runs on GPUs of an enclosing lease of ours, under that lease."""
    from gpuwarden.jobs import launch

    covered = enclosed.gpus
    argv = launch.ddp_argv(cmd, len(covered)) if ddp else list(cmd)
    env = enclosed.env
    if ddp:
        env["GPUWARDEN_DDP_BACKEND"] = "nccl"
    inner = _container(argv, covered, env.get("GPUWARDEN_JOB"), (), env)
    if inner is not None:  # the enclosing lease holds the GPUs: nothing to pass in
        from gpuwarden.containers.runtime import start as start_container

        return HeldJob(start_container(inner, env, ()), isolation=isolation)
    return HeldJob(launch.start(argv, env), isolation=isolation)


def _direct(
    held: Held,
    machine: Sequence[Gpu],
    cmd: Sequence[str],
    ddp: bool,
    nproc: Optional[int],
    devices: str,
    use_uuid: bool,
    isolation: list[Isolation],
) -> HeldJob:
    """This process leased (no queue service): launch the job under the lease."""
    from gpuwarden.jobs import launch

    try:
        argv = list(cmd)
        if ddp:
            if nproc is not None and nproc != len(held.gpus):
                from gpuwarden.base.errors import UserError

                raise UserError(
                    f"--nproc {nproc} with {len(held.gpus)} GPU(s): --ddp runs one rank "
                    "per GPU; ask for -g N instead (or --cpu --nproc N)"
                )
            argv = launch.ddp_argv(cmd, len(held.gpus))
        env = launch.job_env(os.environ, held.gpus, use_uuid=use_uuid, job=held.job, mem=held.mem)
        if ddp:
            env["GPUWARDEN_DDP_BACKEND"] = "nccl"
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
            confine(cgroup, held.gpus, machine, devices)

    if container is not None:
        from gpuwarden.containers.runtime import start as start_container

        plan = container

        def begin() -> StartedJob:
            return start_container(plan, env, held.fds)
    else:
        argv_now = argv

        def begin() -> StartedJob:
            return launch.start(argv_now, env, held.fds)

    def kill(job: StartedJob) -> None:
        holding.kill_group(job.pid)
        job.wait()

    command = launch.command_text(cmd)
    started.job = holding.start_published(held, command, begin, kill, confine)
    return started


def _container(
    argv: list[str],
    gpus: Sequence[Gpu],
    job: Optional[str],
    fds: Sequence[int],
    env: dict[str, str],
) -> Optional[Plan]:
    """The container command rewritten for a lease on `gpus` whose descriptors are `fds`
    (docs/containers.md), or None when `argv` starts no container (the command line's
    module is not loaded then)."""
    from gpuwarden.containers import runtime_of

    if runtime_of(argv) is None:
        return None
    from gpuwarden.containers.command import plan_here

    dev = os.environ.get("GPUWARDEN_DEV_DIR", "/dev")
    return plan_here(argv, gpus, job, len(fds), env, dev)
