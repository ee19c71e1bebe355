"""`gpuwarden run`: pick GPUs, lease them, run the command on them, free them on exit.

Exit status: the command's own; 128+N when signal N killed it; 127 when the
command does not exist (126: not runnable); 2 for a bad request, including one
that can never fit on this machine; 75 when nothing fits now (without
`--wait`) or `--timeout` ran out. See docs/run.md.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time

from gpuwarden.errors import UserError

TYPE_CHECKING = False  # typing stays off the start-up path; annotations need it only here
if TYPE_CHECKING:
    import argparse
    from typing import Any, Callable, Optional

    from gpuwarden.cli import Commands

    Parser = argparse.ArgumentParser


def add_filters(parser: Parser) -> None:
    """Which GPUs fit (shared with `select`), plus what holding them takes; `reserve`
    uses these too."""
    from gpuwarden.cli import filters

    pick = parser.add_argument_group("which GPUs (defaults come from `gpuwarden config`)")
    pick.add_argument("-g", "--count", metavar="N", help="how many GPUs (0: none, CPU only)")
    filters.add_filters(pick)
    pick.add_argument("--wait", action="store_true", default=None, help="wait in line for GPUs")
    pick.add_argument("--timeout", metavar="T", help="with --wait: give up after T (90s, 5m, 2h)")
    pick.add_argument(
        "--uuid", action="store_true", help="CUDA_VISIBLE_DEVICES as UUIDs, not indices"
    )


def register(commands: Commands, name: str) -> None:
    from gpuwarden.cli import subcommand

    parser = subcommand(commands, name)
    parser.usage = "gpuwarden run [-g N | --gpus IDS] [filters] [--wait] -- CMD ARGS..."
    parser.epilog = (
        "exit status: the command's; 128+N if killed by signal N; 127 command not found; "
        "2 bad request or never fits; 75 no GPU free now (without --wait) or --timeout"
    )
    add_filters(parser)
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
    slurm = parser.add_argument_group("Slurm (docs/slurm.md)")
    slurm.add_argument("--slurm", action="store_true", help="run it as a Slurm job, via srun")
    slurm.add_argument("--nodes", metavar="K", help="with --slurm: this many nodes")
    slurm.add_argument(
        "--time", metavar="T", help="time limit, with the queue service or --slurm (90s, 4h)"
    )
    slurm.add_argument("--constraint", metavar="FEATURES", help="with --slurm: node features")
    slurm.add_argument("--partition", metavar="NAME", help="with --slurm: the partition")
    parser.add_argument("cmd", nargs="...", help="the command, after --")  # "...": REMAINDER


def request_of(args: argparse.Namespace) -> tuple[Any, Any]:
    """(config, selection.Request) from the options, over the configured defaults."""
    from gpuwarden import config as cfg
    from gpuwarden.cli import filters
    from gpuwarden.selection import Request

    if getattr(args, "cpu", False):
        if args.count not in (None, "0"):
            raise UserError("--cpu hides every GPU; it cannot be combined with -g " + args.count)
        args.count = "0"
    conf = cfg.load(
        {
            **filters.settings(args),
            "run.wait": args.wait,
            "run.timeout": args.timeout,
            "run.id_format": "uuid" if args.uuid else None,
        }
    )
    mem = filters.mem_of(args)
    if conf.get("run.timeout") is not None and not conf.get("run.wait"):
        raise UserError("--timeout only applies with --wait")
    return conf, Request.from_config(conf, mem=mem)


class Machine:
    """Reads the machine for selection: the first reading is kept for the parent
    CUDA_VISIBLE_DEVICES check and the first attempt; later attempts read afresh."""

    def __init__(self, topology: bool) -> None:
        from gpuwarden.inventory import read_snapshot

        self._read = read_snapshot
        self._topology = topology
        self.first = read_snapshot(processes=True, topology=topology)
        self._fresh = True

    def __call__(self) -> Any:
        if self._fresh:
            self._fresh = False
            return self.first
        return self._read(processes=True, topology=self._topology)


def _what(request: Any) -> str:
    from gpuwarden.leases import describe_request

    return describe_request(request)


class WaitStatus:
    """The one-line live status while waiting: rewritten in place on a terminal, a new
    line only when it changes otherwise (a log file stays readable)."""

    def __init__(self, command: str, request: Any, stream: Any = None) -> None:
        self.prefix = f"gpuwarden {command}: waiting for {_what(request)}"
        self.stream = stream or sys.stderr
        self.tty = self.stream.isatty()
        self.last = ""
        self.shown = False

    def __call__(self, position: int, total: int, reason: str, elapsed: float) -> None:
        from gpuwarden.leases import format_span

        where = f"{_ordinal(position)} in line" + (f" of {total}" if total > 1 else "")
        text = f"{self.prefix} ({where}): {reason}"
        if self.tty:
            from gpuwarden.table import columns

            width = columns(100) - 1
            line = f"{text} [{format_span(elapsed)}]"
            if len(line) > width:
                line = line[: width - 1] + "…"
            self.stream.write("\r\x1b[K" + line)
            self.stream.flush()
            self.shown = True
        elif text != self.last:
            self.stream.write(text + "\n")
            self.stream.flush()
            self.shown = True
        self.last = text

    def done(self, gpus: Any, elapsed: float) -> None:
        if not self.shown:
            return
        from gpuwarden.leases import format_span

        ids = ",".join(str(g.index) for g in gpus)
        end = (
            f"\r\x1b[K{self.prefix.split(':')[0]}: "
            if self.tty
            else f"{self.prefix.split(':')[0]}: "
        )
        self.stream.write(f"{end}granted GPU {ids} after {format_span(elapsed)}\n")
        self.stream.flush()


def take(
    command: str,
    conf: Any,
    request: Any,
    machine: Machine,
    allowed: Any,
    job: Optional[str] = None,
    on_first_wait: Optional[Callable[[], None]] = None,
) -> Any:
    """Lease for `request` as `gpuwarden <command>` does: in line with the live status
    when `run.wait` is set, and a last line saying what was granted after a wait.
    `on_first_wait` is called once, when it turns out that the lease must wait."""
    import gpuwarden.leases as lease

    status = WaitStatus(command, request)
    on_wait: Callable[..., None] = status
    if on_first_wait is not None:
        pending = [on_first_wait]

        def on_wait(*progress: Any) -> None:
            while pending:
                pending.pop()()
            status(*progress)

    started = time.monotonic()
    held = lease.acquire(
        request,
        snapshot=machine,
        wait=bool(conf.get("run.wait")),
        timeout=conf.get("run.timeout"),
        allowed=allowed,
        job=job,
        on_wait=on_wait,
    )
    try:
        status.done(held.gpus, time.monotonic() - started)
    except BaseException:
        held.release()
        raise
    return held


def _ordinal(n: int) -> str:
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


def _command(args: argparse.Namespace) -> list[str]:
    cmd = list(args.cmd)
    if cmd and cmd[0] == "--":
        cmd = cmd[1:]
    return cmd


def dry_run(command: str, snapshot: Any, request: Any, allowed: Any, use_uuid: bool) -> int:
    import gpuwarden.leases as lease
    from gpuwarden import drain, waitline
    from gpuwarden.launch import export_value
    from gpuwarden.mig import devices, label
    from gpuwarden.selection import choose

    ld = lease.open_dir()
    choice = choose(snapshot, request, lease.scan(ld)[0], drain.list_drains(), allowed)
    waiting = waitline.read_line(ld)
    by_uuid = {g.uuid: g for g in devices(snapshot)}
    if choice.ok:
        names = ", ".join(f"GPU {g.index} ({g.name or 'n/a'}, {g.uuid})" for g in choice.gpus)
        print(f"would use {names or 'no GPU'}")
        print(f"  CUDA_VISIBLE_DEVICES={export_value(choice.gpus, use_uuid)}")
    else:
        print(f"would not start now: {choice.error}")
    if waiting:
        print(f"  {len(waiting)} request(s) waiting in line would be served first")
    order = list(by_uuid)
    for uuid, reason in sorted(choice.passed_over.items(), key=lambda kv: order.index(kv[0])):
        print(f"  {label(by_uuid[uuid])}: {reason}")
    if choice.ok:
        return 0
    return 2 if choice.never_fits else lease.EXIT_BUSY


def reserved_gpus(snapshot: Any, request: Any, allowed: Any) -> Optional[tuple[Any, ...]]:
    """Inside a shell set up by `gpuwarden reserve` (GPUWARDEN_RESERVATION), or inside a
    job started by `gpuwarden run` (GPUWARDEN_JOB), a nested job runs on those GPUs under
    the enclosing lease instead of waiting for it to end. None when there is no live
    enclosing lease of ours."""
    enclosing = [os.environ.get(n) for n in ("GPUWARDEN_RESERVATION", "GPUWARDEN_JOB")]
    enclosing = [e for e in enclosing if e]
    if not enclosing:
        return None
    import pwd

    import gpuwarden.leases as lease
    from gpuwarden.drain import list_drains
    from gpuwarden.selection import choose

    leases = lease.list_leases()
    me = pwd.getpwuid(os.geteuid()).pw_name
    for rid in enclosing:
        ours = {i.uuid for i in leases if i.job == rid and i.user == me}
        if not ours:
            continue  # ended or expired: lease normally
        scope = ours if allowed is None else ours & set(allowed)
        others = [i for i in leases if i.job != rid]
        choice = choose(snapshot, request, others, list_drains(), scope)
        if not choice.ok:
            raise UserError(f"within {rid}: {choice.error}")
        return choice.gpus
    return None


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
    """Set up and start the job with the cyclic garbage collector paused (what the set-up
    builds lives until exit: walking it dozens of times, and again at exit, freed
    nothing; see gpuwarden.cli.oneshot), then wait for the job with it back on."""
    from gpuwarden.cli.oneshot import one_shot

    if args.slurm:
        from gpuwarden.cli.submit import run_attached

        return run_attached(args)
    isolation: list[Any] = []  # the job's device cgroup, when gpuwarden.cgroups made one
    try:
        with one_shot() as resume:
            started, held = _start(args, resume, isolation)
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
    from gpuwarden.service.client import job_fields, run_attached
    from gpuwarden.units import parse_duration

    argv = launch.ddp_argv(cmd, request.gpu_count) if args.ddp else cmd
    limit = None if args.time is None else parse_duration(args.time)
    fields = job_fields(request, argv, time_limit=limit)
    fields["wait"] = bool(conf.get("run.wait"))
    return run_attached(fields, conf.get("service.socket"), timeout=conf.get("run.timeout"))


def _start(
    args: argparse.Namespace, resume: Callable[[], None], isolation: list[Any]
) -> tuple[Any, Any]:
    """(the started job, or the exit code when none was started; the lease held for it,
    or None)."""
    from gpuwarden import launch

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
    conf, request = request_of(args)
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

    devices = conf.get("enforce.devices")  # a device cgroup for the job, as root
    if not args.dry_run and devices != "off" and (os.geteuid() == 0 or devices == "require"):
        from gpuwarden.cgroups import isolate

        isolation.extend(isolate(devices))
    machine = Machine(topology=request.gpu_count > 1)
    if not machine.first.gpus and machine.first.error and _gpus_unspecified(args, conf):
        # The same command on a laptop and on the server: with no NVIDIA driver and no
        # GPU asked for by name or number, the job runs on the CPU (documented fallback).
        note = f"{machine.first.error}: the job runs with no GPU (-g N would refuse instead)"
        print(f"gpuwarden run: {note}", file=sys.stderr)
        return _start_on_cpu(args, cmd), None
    allowed = launch.allowed_uuids(machine.first)
    if args.dry_run:
        return dry_run(args.command, machine.first, request, allowed, use_uuid), None
    covered = reserved_gpus(machine.first, request, allowed)
    if covered is not None:
        argv = launch.ddp_argv(cmd, len(covered)) if args.ddp else cmd
        env = launch.job_env(os.environ, covered, use_uuid=use_uuid)
        for name in ("GPUWARDEN_JOB", "GPUWARDEN_LEASE", "GPUWARDEN_MEM_LIMIT"):
            if name in os.environ:  # still under the enclosing job's lease
                env[name] = os.environ[name]
        if args.ddp:
            env["GPUWARDEN_DDP_BACKEND"] = "nccl"
        return launch.start(argv, env), None
    held = take(args.command, conf, request, machine, allowed, on_first_wait=resume)
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
        for cgroup in isolation:
            from gpuwarden.cgroups import confine

            confine(cgroup, held.gpus, machine.first.gpus, devices)
        held.prepare(launch.command_text(cmd))  # a full disk fails here, before the job
        job = launch.start(argv, env, held.fds)
    except BaseException:
        held.release()
        raise
    try:
        held.publish(job.pid)
    except BaseException:
        # A job must never run under a lease others cannot see: stop it.
        import signal

        with contextlib.suppress(ProcessLookupError):
            os.killpg(job.pid, signal.SIGKILL)
        job.wait()
        held.release()
        raise
    return job, held
