"""`gpuwarden sim`: list, inspect and steer simulated machines from the shell.

Changes go to the machine's shared state file, so every NVML client already
running on it (an exporter, `gpuwarden status --watch`, nvitop) sees them.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any, Optional

from gpuwarden.base.errors import UserError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from gpuwarden.cli import Commands


def register(commands: Commands, name: str) -> None:
    from gpuwarden.cli import subcommand

    parser = subcommand(commands, name)
    sub = parser.add_subparsers(dest="action", metavar="ACTION")
    sub.required = True
    sub.add_parser("list", help="the bundled specs")
    show = sub.add_parser("show", help="a spec's GPUs, their figures, and its state file")
    show.add_argument("spec", nargs="?", help="bundled name or TOML path (default: GPUWARDEN_SIM)")
    env = sub.add_parser("env", help="print shell exports that make any NVML client see SPEC")
    env.add_argument("spec", help="bundled name or TOML path")

    inject = sub.add_parser("inject", help="a fault: xid, lose, ecc, remap, throttle")
    kinds = inject.add_subparsers(dest="fault", metavar="FAULT")
    kinds.required = True
    xid = kinds.add_parser("xid", help="an XID error, delivered to NVML event waiters")
    xid.add_argument("xid", type=int)
    kinds.add_parser("lose", help="the GPU falls off the bus (XID 79, then GpuIsLost)")
    ecc = kinds.add_parser("ecc", help="set volatile ECC error counts")
    ecc.add_argument("--uncorrected", type=int)
    ecc.add_argument("--corrected", type=int)
    remap = kinds.add_parser("remap", help="set row-remapping state")
    remap.add_argument("--pending", action=argparse.BooleanOptionalAction, default=True)
    remap.add_argument("--failure", action=argparse.BooleanOptionalAction, default=None)
    throttle = kinds.add_parser("throttle", help="set clock event (throttle) reasons")
    throttle.add_argument("reasons", nargs="?", default="", help="comma-separated; empty clears")
    for p in (xid, kinds.choices["lose"], ecc, remap, throttle):
        _common(p, gpu_required=True)

    setp = sub.add_parser("set", help="set GPU fields: util=.. temp=.. power=.. mem=.. fan=..")
    setp.add_argument("fields", nargs="+", metavar="KEY=VALUE")
    _common(setp, gpu_required=True)

    occupy = sub.add_parser(
        "occupy", help="run CMD as a compute process holding memory on simulated GPUs"
    )
    occupy.add_argument("--mem", required=True, help="memory held on each GPU, e.g. 20GiB")
    occupy.add_argument("--util", type=int, default=0, help="GPU utilization it adds (percent)")
    occupy.add_argument("--user", help="user shown for it (default: you)")
    occupy.add_argument("cmd", nargs=argparse.REMAINDER, help="-- CMD ARGS (default: wait)")
    _common(occupy, gpu_required=False)

    reset = sub.add_parser("reset", help="back to the spec's initial state")
    _common(reset, gpu_required=False, gpu=False)


def _common(p: argparse.ArgumentParser, gpu_required: bool, gpu: bool = True) -> None:
    p.add_argument("--spec", help="bundled name or TOML path (default: GPUWARDEN_SIM)")
    if gpu:
        p.add_argument(
            "--gpu",
            required=gpu_required,
            help="NVML index or UUID" + ("" if gpu_required else "; comma-separated for several"),
        )


def run(args: argparse.Namespace) -> int:
    return int(_ACTIONS[args.action](args) or 0)


def _machine(args: argparse.Namespace) -> Any:
    from gpuwarden.sim import Machine

    return Machine.open(getattr(args, "spec", None))


def _list(args: argparse.Namespace) -> int:
    from gpuwarden.sim import specs

    for name in specs.bundled():
        print(f"{name:<20} {specs.load(name).description}")
    return 0


def _show(args: argparse.Namespace) -> int:
    from gpuwarden.base.table import render
    from gpuwarden.base.units import format_size
    from gpuwarden.sim import specs

    name = args.spec or os.environ.get("GPUWARDEN_SIM")
    if not name:
        raise UserError("give a spec name (see `gpuwarden sim list`) or set GPUWARDEN_SIM")
    spec = specs.load(name)
    cuda = f"{spec.cuda_version // 1000}.{spec.cuda_version % 1000 // 10}"
    print(f"{spec.name}: {spec.description}")
    print(f"file: {spec.path}")
    print(f"state: {specs.state_file(spec)}")
    if not spec.driver:
        print("driver: none (nvmlInit raises NVMLError_LibraryNotFound)")
        return 0
    print(f"driver {spec.driver_version}, CUDA {cuda}" + (", NVSwitch" if spec.nvswitch else ""))
    rows = []
    for g in spec.gpus:
        procs = [p for p in spec.processes if p["gpu"] == g["uuid"]]
        rows.append(
            [
                str(g["index"]),
                g["pci_bus_id"],
                g["name"],
                format_size(g["memory_total"]),
                f"{g['power_limit']:.0f}W",
                "{}.{}".format(*g["compute_capability"]),
                f"{g['clock_sm_max']}MHz",
                ", ".join(f"{p['user']}({format_size(p['memory'])})" for p in procs) or "-",
            ]
        )
    print(render(["GPU", "BUS", "NAME", "MEMORY", "POWER", "CC", "MAX SM", "PROCESSES"], rows))
    return 0


def _env(args: argparse.Namespace) -> int:
    import shlex

    import gpuwarden
    from gpuwarden.sim import specs
    from gpuwarden.sim.fake import SHIM_DIR

    spec = specs.load(args.spec)  # validates the name before the shell trusts it
    value = args.spec if Path(spec.path).parent == Path(specs.SPEC_DIR) else spec.path
    paths = [SHIM_DIR]
    package_parent = Path(gpuwarden.__file__).resolve().parent.parent
    if package_parent.name not in ("site-packages", "dist-packages"):
        paths.append(str(package_parent))  # a source checkout: the shim must import gpuwarden
    joined = ":".join(shlex.quote(p) for p in paths)
    print(f"export GPUWARDEN_SIM={shlex.quote(value)}")
    print(f'export PYTHONPATH={joined}"${{PYTHONPATH:+:$PYTHONPATH}}"')
    if os.environ.get("GPUWARDEN_SIM_STATE"):
        print(f"export GPUWARDEN_SIM_STATE={shlex.quote(os.environ['GPUWARDEN_SIM_STATE'])}")
    print(f"# now any Python NVML client (import pynvml) in this shell sees {spec.name}")
    return 0


def _inject(args: argparse.Namespace) -> int:
    machine = _machine(args)
    if args.fault == "xid":
        if args.xid < 1:
            raise UserError(f"XID {args.xid}: an XID is a positive number, as the driver logs it")
        machine.inject_xid(args.gpu, args.xid)
    elif args.fault == "lose":
        machine.lose(args.gpu)
    elif args.fault == "ecc":
        if args.uncorrected is None and args.corrected is None:
            raise UserError("say --uncorrected N and/or --corrected N")
        machine.set_ecc(args.gpu, uncorrected=args.uncorrected, corrected=args.corrected)
    elif args.fault == "remap":
        machine.set_remapped_rows(args.gpu, pending=args.pending, failure=args.failure)
    else:
        machine.set_throttle(args.gpu, args.reasons)
    return 0


_SET_ALIASES = {
    "util": "utilization",
    "mem_util": "memory_utilization",
    "temp": "temperature",
    "mem": "memory_used",
}
_BOOLS = {"true": True, "1": True, "on": True, "false": False, "0": False, "off": False}


def _set(args: argparse.Namespace) -> int:
    from gpuwarden.base.units import parse_size

    fields: dict[str, Any] = {}
    for item in args.fields:
        key, sep, value = item.partition("=")
        if not sep:
            raise UserError(f"expected KEY=VALUE, got {item!r}")
        key = _SET_ALIASES.get(key, key)
        try:
            if key == "memory_used":
                fields[key] = parse_size(value)
            elif key in ("persistence", "lost"):
                fields[key] = _BOOLS[value.lower()]
            elif key == "compute_mode":
                fields[key] = value
            elif key == "power":
                fields[key] = float(value)
            else:
                fields[key] = int(value)
        except (KeyError, ValueError):
            raise UserError(f"bad value for {key}: {value!r}") from None
    _machine(args).set_gpu(args.gpu, **fields)
    return 0


def _occupy_targets(args: argparse.Namespace, machine: Any) -> list[str]:
    """NVML indices or UUIDs of the GPUs to occupy: --gpu, else CUDA_VISIBLE_DEVICES."""
    if args.gpu:
        return [g.strip() for g in args.gpu.split(",") if g.strip()]
    if os.environ.get("CUDA_VISIBLE_DEVICES") is None:
        raise UserError("say which GPUs: --gpu INDEX, or set CUDA_VISIBLE_DEVICES")
    from gpuwarden.machine.inventory import read_snapshot
    from gpuwarden.placement.visible import resolve
    from gpuwarden.sim.fake import module

    view = resolve(read_snapshot(module(machine.spec.path), processes=False))
    if view.problems:
        raise UserError(view.problems[0])
    if not view.devices:
        raise UserError("CUDA_VISIBLE_DEVICES exposes no GPU of the simulated machine")
    return [str(d.index) for d in view.devices]


def _occupy(args: argparse.Namespace) -> int:
    import getpass

    from gpuwarden.base.units import parse_size

    machine = _machine(args)
    size = parse_size(args.mem)
    cmd = list(args.cmd)
    if cmd and cmd[0] == "--":
        cmd = cmd[1:]
    targets = _occupy_targets(args, machine)
    user = args.user or getpass.getuser()
    child: Optional[subprocess.Popen[bytes]] = None
    pid, command = os.getpid(), "gpuwarden sim occupy"
    # Everything from the child's start on sits inside one try, so that Ctrl-C at any
    # moment (even while the process is being registered) still unregisters it and
    # never leaves the child running on its own.
    try:
        if cmd:
            try:
                child = subprocess.Popen(cmd)
            except OSError as err:
                raise UserError(f"cannot run {cmd[0]}: {err.strerror}") from None
            pid, command = child.pid, " ".join(cmd)
        for target in targets:
            machine.add_process(target, pid, size, user=user, command=command, util=args.util)
        if child is None:
            print(f"holding {args.mem} on GPU {','.join(targets)} as pid {pid}; Ctrl-C releases")
            signal.pause()
            return 0
        while True:
            try:
                code = child.wait()
                break
            except KeyboardInterrupt:
                child.send_signal(signal.SIGINT)
        return code if code >= 0 else 128 - code
    except KeyboardInterrupt:
        return 0
    finally:
        machine.remove_process(pid)
        if child is not None and child.poll() is None:
            child.kill()
            child.wait()


def _reset(args: argparse.Namespace) -> int:
    machine = _machine(args)
    machine.reset()
    print(f"{machine.name}: back to the spec's initial state", file=sys.stderr)
    return 0


_ACTIONS = {
    "list": _list,
    "show": _show,
    "env": _env,
    "inject": _inject,
    "set": _set,
    "occupy": _occupy,
    "reset": _reset,
}
