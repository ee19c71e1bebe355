"""`gpuwarden run`: pick GPUs, lease them, run the command on them, free them on exit.

Exit status: the command's own; 128+N when signal N killed it; 127 when the
command does not exist (126: not runnable); 2 for a bad request, including one
that can never fit on this machine; 75 when nothing fits now (without
`--wait`) or `--timeout` ran out. See docs/run.md.
"""

from __future__ import annotations

from gpuwarden.base.errors import UserError

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
    from gpuwarden.jobs import options as filters

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
    filters.add_account_option(parser)
    filters.add_slurm_options(parser, "run it as a Slurm job, via srun")
    parser.add_argument("cmd", nargs="...", help="the command, after --")  # "...": REMAINDER


def _command(args: argparse.Namespace) -> list[str]:
    cmd = list(args.cmd)
    if cmd and cmd[0] == "--":
        cmd = cmd[1:]
    return cmd


def dry_run(command: str, snapshot: Any, request: Any, allowed: Any, conf: Any) -> int:
    from gpuwarden.jobs.allocation import choose_now, waiting_count
    from gpuwarden.jobs.launch import export_value
    from gpuwarden.leases import EXIT_BUSY
    from gpuwarden.placement.mig import devices, label

    choice = choose_now(snapshot, request, allowed, conf)
    waiting = waiting_count(conf)
    use_uuid = conf.get("run.id_format") == "uuid"
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


def run(args: argparse.Namespace) -> int:
    """Parse the options into `jobs.path.start`, which decides everything; print a dry
    run's plan, or wait for the job and free what it held."""
    if args.slurm:
        from gpuwarden.cli.slurmjobs import run_attached

        return run_attached(args)
    from gpuwarden.jobs import options as filters

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
    from gpuwarden.jobs.path import HeldJob, start

    def taking(machine: Any, allowed: Any) -> Any:
        from gpuwarden.cli.waiting import take  # the direct path only

        return take(args.command, conf, request, machine, allowed)

    outcome = start(
        request,
        cmd,
        conf,
        ddp=args.ddp,
        nproc=args.nproc,
        dry_run=args.dry_run,
        time_limit=args.time,
        warning=lambda: filters.warning_of(args),
        take=taking,
    )
    if isinstance(outcome, HeldJob):
        return outcome.wait()
    snapshot, scope = outcome  # a dry run: what it would take
    if snapshot is None:
        print("would use no GPU\n  CUDA_VISIBLE_DEVICES=")
        return 0
    return dry_run(args.command, snapshot, request, scope, conf)
