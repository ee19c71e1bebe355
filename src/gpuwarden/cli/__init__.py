"""The `gpuwarden` command: find the subcommand, import only its module, run it.

Each subcommand lives in `gpuwarden.cli.<module>` and provides

    HELP: str                                  # one line for `gpuwarden --help`
    def add_arguments(parser) -> None          # argparse options
    def run(args) -> int                       # the exit code

Only the chosen subcommand's module is imported, because `gpuwarden run`
prefixes every training command and its start-up time is paid constantly.
argparse (standard library) is used rather than a third-party CLI library for
the same reason: click alone costs ~30 ms to import on a small machine. Commands
declare their options through argparse's calls on `gpuwarden.cli.options.Options`,
which reads a plain command line without importing argparse at all and hands
help, errors and anything unusual to argparse.

`UserError` from anywhere below becomes one line on stderr and its exit code;
an unexpected exception is still a bug and keeps its traceback.
"""

from __future__ import annotations

import gc
import os
import sys
from collections.abc import Sequence

from gpuwarden.cli import deferred
from gpuwarden.cli.options import NeedsArgparse, Options, formatter

TYPE_CHECKING = False  # typing costs ~2.5 ms to import; annotations need it only here
if TYPE_CHECKING:
    import argparse
    from typing import Any

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
    "enforce": ("enforce", "apply the [enforce] policies: memory over-use, unleased use, idle"),
    "exporter": ("exporter", "serve Prometheus metrics for GPUs, users and leases"),
    "web": ("web", "serve a live web page of the GPUs, leases, queue and faults"),
    "record": ("record", "append per-GPU samples to a CSV file"),
    "plot": ("plot", "draw a recorded CSV as a picture"),
    "sim": ("sim", "run and steer a simulated GPU machine"),
    "serve": ("serve", "run the queue service of a shared machine (root)"),
    "hold": ("hold", "keep waiting jobs from starting (queue service)"),
    "unhold": ("hold", "let held jobs start again (queue service)"),
    "jobs": ("jobs", "finished jobs: how they ended, GPU-hours (queue service)"),
    "share": ("share", "each user's GPU usage and fair-share factor (queue service)"),
    "submit": ("submit", "hand a job to Slurm (--slurm): the same request as `run`"),
    "queue": ("queue", "show queued and running jobs (--slurm: Slurm's, in the same words)"),
    "cancel": ("cancel", "cancel queued or running jobs (--slurm: Slurm job ids)"),
    "logs": ("logs", "show or follow a job's output (--slurm: a Slurm job's)"),
    "slurm": ("slurm", "Slurm admin help: gres.conf lines, prolog/epilog leases"),
    "service": ("service", "install, remove or check the queue service (admins)"),
}


def _top_parser() -> argparse.ArgumentParser:
    """Only for `gpuwarden --help` and errors (building it costs milliseconds that
    `gpuwarden run` should not pay); the split itself is `_split`."""
    import argparse

    lines = [f"  {name:<10} {summary}" for name, (_, summary) in COMMANDS.items()]
    parser = argparse.ArgumentParser(
        prog="gpuwarden",
        usage="gpuwarden [--sim SPEC] [--version] COMMAND [ARGS...]",
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
    return parser


def _split(argv: list[str]) -> tuple[dict[str, str | bool], str | None, list[str]]:
    """Global options, the command, and everything after it, untouched.

    Done by hand because argparse's REMAINDER drops a `--` that directly follows
    the command, and `gpuwarden run -- --weird-script` must reach `run` intact.
    """
    options: dict[str, str | bool] = {}
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg in ("-h", "--help", "--version"):
            options[arg.lstrip("-")] = True
        elif arg == "--sim" and i + 1 < len(argv):
            options["sim"] = argv[i + 1]
            i += 1
        elif arg.startswith("--sim="):
            options["sim"] = arg.split("=", 1)[1]
        elif arg.startswith("-"):
            options.setdefault("bad", arg)
        else:
            return options, arg, argv[i + 1 :]
        i += 1
    return options, None, []


def main(argv: Sequence[str] | None = None) -> int:
    # Imports and argument parsing build objects that live until exit; the cyclic
    # collector would walk them again and again (and once more at exit) for
    # nothing. Pause it until they exist (the command's modules are imported and
    # its options read below for that reason), then freeze them out of its sight.
    gc.disable()
    try:
        deferred.install()
        module, command, args = _parse(argv)
    finally:
        gc.freeze()
        gc.enable()
    if module is None:
        return int(args)
    from gpuwarden.errors import UserError

    try:
        return int(module.run(args) or 0)
    except UserError as err:
        print(f"gpuwarden {command}: {err}", file=sys.stderr)
        return err.exit_code
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # `gpuwarden status | head`: the reader left; that is not an error.
        sys.stderr.close()
        return 0


def _parse(argv: Sequence[str] | None) -> tuple[Any, str, Any]:
    """(the command's module, its name, its parsed arguments), or (None, "", exit code)
    when there is nothing to run (--version, --help)."""
    options, command, rest = _split(list(sys.argv[1:] if argv is None else argv))
    if options.get("version"):
        from gpuwarden import __version__

        print(f"gpuwarden {__version__}")
        return None, "", 0
    if "bad" in options:
        bad = options["bad"]
        _top_parser().error(f"unrecognized option {bad!r} (global options go before COMMAND)")
    if command is None or options.get("help"):
        _top_parser().print_help()
        return None, "", 0
    if command not in COMMANDS:
        _top_parser().error(f"unknown command {command!r}{_did_you_mean(command)}")
    if "sim" in options:
        os.environ["GPUWARDEN_SIM"] = str(options["sim"])
    module_name, summary = COMMANDS[command]
    name = f"gpuwarden.cli.{module_name}"
    __import__(name)  # not importlib.import_module: the importlib package costs ~0.5 ms
    module = sys.modules[name]
    prog = f"gpuwarden {command}"
    try:
        declared = Options(prog, summary)
        _declare(module, declared, command)
        args = declared.parse(rest)
    except NeedsArgparse:  # the command declares more than Options reads
        import argparse

        parser = argparse.ArgumentParser(
            prog=prog, description=summary, formatter_class=formatter()
        )
        _declare(module, parser, command)
        args = parser.parse_args(rest)
    args.command = command
    return module, command, args


def _did_you_mean(command: str) -> str:
    """`; did you mean 'status'?` for `stauts`, else the list of commands."""
    import difflib

    close = difflib.get_close_matches(command, list(COMMANDS), n=1, cutoff=0.6)
    if close:
        return f"; did you mean {close[0]!r}?"
    return f" (choose from {', '.join(COMMANDS)})"


def _declare(module: Any, parser: Any, command: str) -> None:
    if getattr(module, "SERVES_SEVERAL", False):
        module.add_arguments(parser, command)  # drain/undrain, reserve/release
    else:
        module.add_arguments(parser)
