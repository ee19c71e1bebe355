"""The `gpuwarden` command: find the subcommand, import only its module, run it.

Each subcommand lives in `gpuwarden.cli.<module>` and provides

    HELP: str                                  # one line for `gpuwarden --help`
    def add_arguments(parser) -> None          # argparse options
    def run(args) -> int                       # the exit code

Only the chosen subcommand's module is imported, because `gpuwarden run`
prefixes every training command and its start-up time is paid constantly.
argparse (standard library) is used rather than a third-party CLI library for
the same reason: click alone costs ~30 ms to import on a small machine.

`UserError` from anywhere below becomes one line on stderr and its exit code;
an unexpected exception is still a bug and keeps its traceback.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from importlib import import_module

# name -> (module under gpuwarden.cli, one-line summary). The summaries are
# here, not in the modules, so that `gpuwarden --help` imports nothing.
COMMANDS: dict[str, tuple[str, str]] = {
    "status": ("status", "show GPUs, their memory, load, health, processes and leases"),
    "visible": ("visible", "show which GPUs CUDA_VISIBLE_DEVICES exposes, in CUDA's order"),
    "run": ("run", "pick free GPUs, reserve them and run a command on them"),
    "select": ("select", "print the IDs of GPUs that fit, without reserving them"),
    "reserve": ("reserve", "hold GPUs for an interactive session"),
    "release": ("reserve", "end a reservation made with `gpuwarden reserve`"),
    "drain": ("drain", "take GPUs out of service, with a reason"),
    "undrain": ("drain", "put drained GPUs back into service"),
    "config": ("config", "show each effective setting and where it came from"),
    "doctor": ("doctor", "find driver, CUDA, PyTorch and environment problems"),
    "health": ("health", "judge each GPU's health (XID, ECC, lost, throttling)"),
    "exporter": ("exporter", "serve Prometheus metrics for GPUs, users and leases"),
    "record": ("record", "append per-GPU samples to a CSV file"),
    "plot": ("plot", "draw a recorded CSV as a picture"),
    "sim": ("sim", "run and steer a simulated GPU machine"),
}


def _top_parser() -> argparse.ArgumentParser:
    lines = [f"  {name:<10} {summary}" for name, (_, summary) in COMMANDS.items()]
    parser = argparse.ArgumentParser(
        prog="gpuwarden",
        description="Pick, reserve, watch and diagnose NVIDIA GPUs on shared machines.",
        epilog="commands:\n" + "\n".join(lines) + "\n\nRun `gpuwarden COMMAND --help` for more.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--sim",
        metavar="SPEC",
        help="use a simulated machine (bundled name or TOML path); same as GPUWARDEN_SIM",
    )
    parser.add_argument("--version", action="store_true", help="print the version and exit")
    parser.add_argument("command", nargs="?", choices=list(COMMANDS), metavar="COMMAND")
    parser.add_argument("rest", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    from gpuwarden.errors import UserError

    argv = list(sys.argv[1:] if argv is None else argv)
    top = _top_parser()
    ns = top.parse_args(argv)
    if ns.version:
        from gpuwarden import __version__

        print(f"gpuwarden {__version__}")
        return 0
    if ns.command is None:
        top.print_help()
        return 0
    if ns.sim:
        os.environ["GPUWARDEN_SIM"] = ns.sim
    module_name, summary = COMMANDS[ns.command]
    module = import_module(f"gpuwarden.cli.{module_name}")
    parser = argparse.ArgumentParser(prog=f"gpuwarden {ns.command}", description=summary)
    if getattr(module, "SERVES_SEVERAL", False):
        module.add_arguments(parser, ns.command)  # drain/undrain, reserve/release
    else:
        module.add_arguments(parser)
    args = parser.parse_args(ns.rest)
    args.command = ns.command
    try:
        return int(module.run(args) or 0)
    except UserError as err:
        print(f"gpuwarden {ns.command}: {err}", file=sys.stderr)
        return err.exit_code
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # `gpuwarden status | head`: the reader left; that is not an error.
        sys.stderr.close()
        return 0
