"""`gpuwarden kernel install|uninstall`: Jupyter kernels that lease their GPUs
(docs/notebooks.md). Each kernel started from the kernelspec leases GPUs at start,
sees exactly them, keeps them across a restart and frees them when it ends."""

from __future__ import annotations

import sys

TYPE_CHECKING = False
if TYPE_CHECKING:
    import argparse

    from gpuwarden.cli import Commands


def register(commands: Commands, name: str) -> None:
    from gpuwarden.cli import subcommand
    from gpuwarden.jobs import options as filters

    parser = subcommand(commands, name)
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    install = actions.add_parser(
        "install",
        help="write a kernelspec whose kernels lease GPUs (JupyterLab: 'Python (1 GPU)')",
        usage="gpuwarden kernel install [-g N | --gpus IDS] [--mem SIZE] [filters] [--time T] "
        "[--name NAME]",
    )
    filters.add_lease_options(install)
    install.add_argument(
        "--time",
        metavar="T",
        help="each kernel's time limit where a queue service runs (8h, 1-00:00:00)",
    )
    filters.add_account_option(install)
    install.add_argument("--name", metavar="NAME", help="the kernel's name (gpuwarden-Ngpu)")
    install.add_argument("--display-name", metavar="TEXT", help="the menu's text (Python (N GPU))")
    install.add_argument(
        "--python", metavar="PATH", help="the Python with ipykernel (default: this one)"
    )
    where = install.add_mutually_exclusive_group()
    where.add_argument("--prefix", metavar="DIR", help="install under DIR/share/jupyter/kernels")
    where.add_argument(
        "--sys-prefix", action="store_true", help="install into this Python's environment"
    )
    uninstall = actions.add_parser("uninstall", help="remove a kernelspec gpuwarden wrote")
    uninstall.add_argument("name", metavar="NAME")
    uninstall.add_argument("--prefix", metavar="DIR", help="the prefix given to install")
    uninstall.add_argument("--sys-prefix", action="store_true", help="as given to install")


def run(args: argparse.Namespace) -> int:
    from gpuwarden.jupyter import kernelspec

    prefix = sys.prefix if args.sys_prefix else args.prefix
    if args.action == "uninstall":
        print(f"removed {kernelspec.uninstall(args.name, prefix)}")
        return 0
    request = _request(args)
    from gpuwarden.base.units import parse_duration
    from gpuwarden.jobs.api import time_limit

    timeout = None if args.timeout is None else parse_duration(args.timeout)
    limit = time_limit(args.time, "--time")
    kernel = kernelspec.spec(
        request,
        args.python or sys.executable,
        args.display_name,
        bool(args.wait),
        timeout,
        uuid=bool(args.uuid),
        time_limit=limit,
        account=args.account,
    )
    name = args.name or kernelspec.default_name(request)
    path = kernelspec.install(name, kernel, prefix)
    print(f"installed {kernel['display_name']!r} as {name}: {path}")
    return 0


def _request(args: argparse.Namespace) -> dict[str, object]:
    """The request as gpuwarden.lease()'s arguments, checked now as `run` checks them, so
    a bad value is refused here rather than by every kernel start."""
    from gpuwarden.base.errors import UserError
    from gpuwarden.jobs.api import _request as check
    from gpuwarden.jobs.options import mem_of, settings

    given = settings(args)
    count = given["run.count"]
    request: dict[str, object] = {
        "n": int(str(count)) if count is not None else None,
        "gpus": given["run.gpus"],
        "min_free": given["run.min_free"],
        "max_util": given["run.max_util"],
        "min_capability": given["run.min_capability"],
        "model": given["run.model"],
        "exclude": given["run.exclude"],
        "mem": args.mem,
    }
    if request["n"] == 0:
        raise UserError("-g 0 asks for no GPU: a plain Python kernel needs no gpuwarden")
    if args.mig is not None:
        raise UserError("--mig is not offered for kernels yet: lease a slice by its UUID (--gpus)")
    mem = mem_of(args)
    check(*request.values())  # type: ignore[arg-type]
    _never_fits(given, mem)
    return request


def _never_fits(given: dict[str, object], mem: object) -> None:
    """Refuse, in one line as `run` does, a kernel that could never start on this
    machine (`-g 99` on eight GPUs): every start of it would fail. Where no GPU can be
    read (a login node without them), nothing is judged."""
    from gpuwarden import config
    from gpuwarden.base.errors import UserError
    from gpuwarden.machine.inventory import read_snapshot
    from gpuwarden.placement.request import Request
    from gpuwarden.placement.selection import choose

    cfg = config.load(cli=given)
    try:
        snapshot = read_snapshot()
    except UserError:
        return
    if not snapshot.gpus:
        return
    choice = choose(snapshot, Request.from_config(cfg, mem=mem))
    if choice.never_fits:
        raise UserError(f"this kernel could never start here: {choice.error}")
