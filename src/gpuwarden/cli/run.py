"""`gpuwarden run`: pick GPUs, lease them, run the command on them, free them on exit.

Exit status: the command's own; 128+N when signal N killed it; 127 when the
command does not exist (126: not runnable); 2 for a bad request, including one
that can never fit on this machine; 75 when nothing fits now (without
`--wait`) or `--timeout` ran out. See docs/run.md.
"""

from __future__ import annotations

import os
import sys

from gpuwarden.errors import UserError

TYPE_CHECKING = False  # typing stays off the start-up path; annotations need it only here
if TYPE_CHECKING:
    import argparse
    from typing import Any

    from gpuwarden.cli import Commands

    Parser = argparse.ArgumentParser


def register(commands: Commands, name: str) -> None:
    from gpuwarden.cli import subcommand

    parser = subcommand(commands, name)
    parser.usage = "gpuwarden run [-g N | --gpus IDS] [filters] [--wait] -- CMD ARGS..."
    parser.epilog = (
        "exit status: the command's; 128+N if killed by signal N; 127 command not found; "
        "2 bad request or never fits; 75 no GPU free now (without --wait) or --timeout"
    )
    from gpuwarden.cli import filters

    filters.add_lease_options(parser)
    parser.add_argument("--cpu", action="store_true", help="hide every GPU (same as -g 0)")
    parser.add_argument("--dry-run", action="store_true", help="say what would be chosen, and why")
    parser.add_argument(
        "--ddp", action="store_true", help="start CMD (a script) with torchrun, one rank per GPU"
    )
    parser.add_argument(
        "--nproc",
        metavar="N",
        type=int,
        help="--ddp ranks on the CPU (gloo); implies --cpu without -g/--gpus",
    )
    filters.add_time_option(parser)
    filters.add_slurm_options(parser, "run it as a Slurm job, via srun")
    parser.add_argument("cmd", nargs="...", help="the command, after --")  # "...": REMAINDER


def _command(args: argparse.Namespace) -> list[str]:
    cmd = list(args.cmd)
    if cmd and cmd[0] == "--":
        cmd = cmd[1:]
    return cmd


def dry_run(command: str, snapshot: Any, request: Any, allowed: Any, use_uuid: bool) -> int:
    from gpuwarden import jobs
    from gpuwarden.launch import export_value
    from gpuwarden.leases import EXIT_BUSY
    from gpuwarden.mig import devices, label

    choice = jobs.choose_now(snapshot, request, allowed)
    waiting = jobs.waiting_count()
    by_uuid = {g.uuid: g for g in devices(snapshot)}
    if choice.ok:
        names = ", ".join(f"GPU {g.index} ({g.name or 'n/a'}, {g.uuid})" for g in choice.gpus)
        print(f"would use {names or 'no GPU'}")
        print(f"  CUDA_VISIBLE_DEVICES={export_value(choice.gpus, use_uuid)}")
    else:
        print(f"would not start now: {choice.error}")
    if waiting:
        print(f"  {waiting} request(s) waiting in line would be served first")
    order = list(by_uuid)
    for uuid, reason in sorted(choice.passed_over.items(), key=lambda kv: order.index(kv[0])):
        print(f"  {label(by_uuid[uuid])}: {reason}")
    if choice.ok:
        return 0
    return 2 if choice.never_fits else EXIT_BUSY


def _gpus_unspecified(args: argparse.Namespace, conf: Any) -> bool:
    """No -g, --gpus or --mem, and no configured count or GPU list: "1 GPU" is a default."""
    keys = ("run.count", "run.gpus")
    return args.mem is None and all(conf.source(k) == "default" for k in keys)


def _start_on_cpu(args: argparse.Namespace, cmd: list[str]) -> Any:
    """Start with every GPU hidden (CUDA_VISIBLE_DEVICES=""), without a lease."""
    from gpuwarden import launch

    if args.dry_run:
        print("would use no GPU\n  CUDA_VISIBLE_DEVICES=")
        return 0
    argv = launch.ddp_argv(cmd, args.nproc or 1) if args.ddp else cmd
    env = launch.job_env(os.environ, ())
    if args.ddp:
        env["GPUWARDEN_DDP_BACKEND"] = "gloo"
    return launch.start(argv, env)


def run(args: argparse.Namespace) -> int:
    """Set up and start the job, wait for it, free what it held."""
    if args.slurm:
        from gpuwarden.cli.slurmjobs import run_attached

        return run_attached(args)
    isolation: list[Any] = []  # the job's device cgroup, when gpuwarden.cgroups made one
    try:
        started, held = _start(args, isolation)
        if isinstance(started, int):
            return started
        try:
            return started.wait()
        finally:
            if held is not None:
                held.release()
    finally:
        for cgroup in isolation:
            cgroup.close()


def _through_service(args: argparse.Namespace, conf: Any, request: Any, cmd: list[str]) -> int:
    """With a queue service on this machine, the service leases the GPUs and starts the
    job, as us and on our terminal (docs/service.md): no user who holds the shared lock
    files can block it, and it takes its turn by priority and fair share."""
    from gpuwarden import launch
    from gpuwarden.queueclient.client import job_fields, run_attached
    from gpuwarden.units import parse_time_limit

    argv = launch.ddp_argv(cmd, request.gpu_count) if args.ddp else cmd
    if not args.ddp:
        from gpuwarden.containers import through_service

        argv = through_service(argv, os.environ.get("GPUWARDEN_DEV_DIR"))
    limit = None if args.time is None else parse_time_limit(args.time)
    from gpuwarden.cli.filters import warning_of

    fields = job_fields(request, argv, time_limit=limit, warning=warning_of(args))
    fields["wait"] = bool(conf.get("run.wait"))
    return run_attached(fields, conf.get("service.socket"), timeout=conf.get("run.timeout"))


def _start(args: argparse.Namespace, isolation: list[Any]) -> tuple[Any, Any]:
    """(the started job, or the exit code when none was started; the lease held for it,
    or None)."""
    from gpuwarden.cli import filters

    cmd = _command(args)
    if args.nproc is not None and not args.ddp:
        raise UserError("--nproc only applies with --ddp")
    if args.nproc is not None and args.nproc < 1:
        raise UserError(f"invalid --nproc {args.nproc}: expected 1 or more")
    if args.ddp and args.nproc is not None and args.count is None and args.gpus is None:
        args.cpu = True  # `--ddp --nproc N` alone: N gloo ranks on the CPU
    if not cmd and not args.dry_run:
        raise UserError(
            "no command given: put it after --, e.g. `gpuwarden run -g 1 -- python train.py`"
        )
    conf, request = filters.request_of(args)
    from gpuwarden.config import reused

    with reused(conf):  # the health rules, lease and state directories: this same reading
        return _start_with(args, conf, request, cmd, isolation)


def _start_with(
    args: argparse.Namespace,
    conf: Any,
    request: Any,
    cmd: list[str],
    isolation: list[Any],
) -> tuple[Any, Any]:
    use_uuid = conf.get("run.id_format") == "uuid"
    if request.count == 0:
        if request.mem is not None:
            raise UserError(
                "--mem asks for a share of a GPU; it cannot be combined with -g 0/--cpu"
            )
        return _start_on_cpu(args, cmd), None
    service = conf.get("service.socket")
    if not args.dry_run and "GPUWARDEN_JOB" not in os.environ and os.path.exists(service):
        return _through_service(args, conf, request, cmd), None
    if args.time is not None:
        raise UserError(
            f"--time needs the queue service (none answers at {service}) or --slurm; "
            "without them a job runs until it ends"
        )
    # Only the direct path chooses, leases and launches here (not through the service).
    from gpuwarden import jobs, launch
    from gpuwarden.cli.waiting import take

    devices = conf.get("enforce.devices")  # a device cgroup for the job, as root
    if not args.dry_run and devices != "off" and (os.geteuid() == 0 or devices == "require"):
        from gpuwarden.cgroups import isolate

        isolation.extend(isolate(devices))
    machine = jobs.Machine(topology=request.gpu_count > 1)
    if not machine.first.gpus and machine.first.error and _gpus_unspecified(args, conf):
        # The same command on a laptop and on the server: with no NVIDIA driver and no
        # GPU asked for by name or number, the job runs on the CPU (documented fallback).
        note = f"{machine.first.error}: the job runs with no GPU (-g N would refuse instead)"
        print(f"gpuwarden run: {note}", file=sys.stderr)
        return _start_on_cpu(args, cmd), None
    allowed = jobs.allowed(machine.first)
    if args.dry_run:
        return dry_run(args.command, machine.first, request, allowed, use_uuid), None
    covered = jobs.within_enclosing(machine.first, request, allowed)
    if covered is not None:
        argv = launch.ddp_argv(cmd, len(covered)) if args.ddp else cmd
        env = launch.job_env(os.environ, covered, use_uuid=use_uuid)
        for name in ("GPUWARDEN_JOB", "GPUWARDEN_LEASE", "GPUWARDEN_MEM_LIMIT"):
            if name in os.environ:  # still under the enclosing job's lease
                env[name] = os.environ[name]
        if args.ddp:
            env["GPUWARDEN_DDP_BACKEND"] = "nccl"
        inner = _container(argv, covered, env.get("GPUWARDEN_JOB"), (), env)
        if inner is not None:  # the enclosing lease holds the GPUs: nothing to pass in
            from gpuwarden.containerjob import start as start_container

            return start_container(inner, env, ()), None
        return launch.start(argv, env), None
    held = take(args.command, conf, request, machine, allowed)
    try:
        argv = cmd
        if args.ddp:
            if args.nproc is not None and args.nproc != len(held.gpus):
                raise UserError(
                    f"--nproc {args.nproc} with {len(held.gpus)} GPU(s): --ddp runs one rank "
                    "per GPU; ask for -g N instead (or --cpu --nproc N)"
                )
            argv = launch.ddp_argv(cmd, len(held.gpus))
        env = launch.job_env(os.environ, held.gpus, use_uuid=use_uuid, job=held.job, mem=held.mem)
        if args.ddp:
            env["GPUWARDEN_DDP_BACKEND"] = "nccl"
        container = _container(argv, held.gpus, held.job, held.fds, env)
    except BaseException:
        held.release()
        raise

    def confine() -> None:
        if not isolation:
            return
        from gpuwarden.cgroups import confine

        for cgroup in isolation:
            confine(cgroup, held.gpus, machine.first.gpus, devices)

    starter = None
    if container is not None:
        from gpuwarden.containerjob import start as start_container

        argv = container.argv

        def starter(_argv: Any, env: Any, fds: Any) -> Any:
            return start_container(container, env, fds)

    job = jobs.launch_leased(held, argv, env, launch.command_text(cmd), confine, starter)
    return job, held


def _container(argv: list[str], gpus: Any, job: Any, fds: Any, env: dict[str, str]) -> Any:
    """The container command rewritten for a lease on `gpus` whose descriptors are `fds`
    (docs/containers.md), or None when `argv` starts no container."""
    from gpuwarden.containers import plan_here

    dev = os.environ.get("GPUWARDEN_DEV_DIR", "/dev")
    return plan_here(argv, gpus, job, len(fds), env, dev)
