"""The `gpuwarden` command: one argparse grammar, only the chosen command's module imported.

Each subcommand lives in `gpuwarden.cli.<module>` (the `COMMANDS` table below
maps the command word to it) and provides

    def register(commands, name) -> None     # its own subparser, `commands.add_parser`
    def run(args) -> int                       # the exit code

The top-level parser holds the global options and a subparser action into
which only the chosen command registers itself: the command word is found
before anything is built, so `gpuwarden run` imports `cli.run` and none of the
twenty-odd other command modules, and `gpuwarden --help` lists the commands
from the table without importing any. Every parser refuses abbreviations
(`allow_abbrev=False`): `gpuwarden run python train.py --m 3` hands `--m 3`
to the job instead of reading it as an abbreviation of one of run's options.

`UserError` from anywhere below becomes one line on stderr and its exit code;
an unexpected exception is still a bug and keeps its traceback.
"""

import os
import sys

TYPE_CHECKING = False  # the typing module is not needed at run time here
if TYPE_CHECKING:
    import argparse
    from collections.abc import Sequence
    from types import ModuleType

    from gpuwarden.cli.parsers import Commands as Commands
    from gpuwarden.queueclient.client import Client

# name -> (module under gpuwarden.cli, one-line summary). The summaries are
# here, not in the modules, so that `gpuwarden --help` imports nothing.
COMMANDS: dict[str, tuple[str, str]] = {
    "status": ("status", "show GPUs, their memory, load, health, processes and leases"),
    "visible": ("visible", "show which GPUs CUDA_VISIBLE_DEVICES exposes, in CUDA's order"),
    "run": ("run", "pick free GPUs, reserve them and run a command on them"),
    "select": ("select", "print the IDs of GPUs that fit, without reserving them"),
    "reserve": ("reserve", "hold GPUs for an interactive session"),
    "release": ("reserve", "end a reservation made with `gpuwarden reserve`"),
    "kernel": ("kernel", "install a Jupyter kernel whose kernels lease their GPUs"),
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
    "requeue": ("requeue", "run batch jobs again under their ids (queue service)"),
    "jobs": ("jobs", "finished jobs: how they ended, GPU-hours (queue service)"),
    "share": ("share", "each user's GPU usage and fair-share factor (queue service)"),
    "limits": ("limits", "the limits the queue service holds you to, and what you use"),
    "report": ("report", "GPU-hours, jobs and waits by user, group or account (as sreport)"),
    "eff": ("eff", "how well jobs used their GPUs: utilisation, memory, energy (as seff)"),
    "digest": ("digest", "your week's GPU use, idle jobs named; weekly by webhook or mail"),
    "submit": (
        "submit",
        "queue a batch job for this machine's queue service (or Slurm's, with --slurm)",
    ),
    "queue": ("queue", "show queued and running jobs (--slurm: Slurm's, in the same words)"),
    "top": ("top", "a full-screen view of the GPUs and the queue that acts on your jobs"),
    "cancel": ("cancel", "cancel queued or running jobs (--slurm: Slurm job ids)"),
    "logs": ("logs", "show or follow a job's output (--slurm: a Slurm job's)"),
    "book": ("book", "book GPUs ahead for a user or group; list or cancel bookings"),
    "slurm": ("slurm", "Slurm admin help: gres.conf lines, prolog/epilog leases"),
    "service": ("service", "install, remove or check the queue service (admins)"),
    "mcp": ("mcp", "answer coding assistants about GPUs and jobs (MCP over stdio)"),
    "completion": ("completion", "print a bash or zsh completion script for gpuwarden"),
}

# The long-running commands: they report through `logging`, set up once here.
DAEMONS = frozenset({"exporter", "health", "web", "serve", "record", "enforce"})
LOG_LEVELS = ("debug", "info", "warning", "error")

# Global options that take a value, for finding the command word before parsing.
_GLOBAL_VALUES = ("--sim", "--log-level")
_GLOBAL_FLAGS = ("-h", "--help", "-V", "--version")


def subcommand(
    commands: "Commands", name: str, *, intermixed: bool = False, **kwargs: str
) -> "argparse.ArgumentParser":
    """The parser of command `name`: its summary from `COMMANDS`, no abbreviations,
    help wrapped to the terminal; `intermixed`: see `CommandParser`. Keywords go to
    `add_parser` (usage, epilog...)."""
    summary = COMMANDS[name][1]
    return commands.add_parser(
        name,
        prog=f"gpuwarden {name}",
        help=summary,
        description=kwargs.pop("description", summary),
        intermixed=intermixed,
        **kwargs,  # type: ignore[arg-type]
    )


def command_word(argv: "Sequence[str]") -> "tuple[str | None, str | None]":
    """(the command word, an unknown option met before it). Global options go
    before the command; everything from the command word on is the command's."""
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg in _GLOBAL_VALUES:
            i += 2
            continue
        if arg in _GLOBAL_FLAGS or arg.partition("=")[0] in _GLOBAL_VALUES:
            i += 1
            continue
        if arg.startswith("-"):
            return None, arg
        return arg, None
    return None, None


def main(argv: "Sequence[str] | None" = None) -> int:
    module, args = parse(list(sys.argv[1:] if argv is None else argv))
    if module is None:
        return 0
    from gpuwarden.base.errors import UserError

    command = args.command
    try:
        if command in DAEMONS:
            configure_logging(args.log_level)
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


def console() -> None:
    """The `gpuwarden` command (and `python -m gpuwarden`): `main`, then the exit.

    When `main` returns, the command's work is done: files written and closed, leases
    released, the job reaped. Unwinding the interpreter (every module's objects freed
    one by one) would only add time to each `gpuwarden run` (docs/performance.md),
    so the process flushes its output and ends there, unless something may still need
    the normal exit: another thread, or modules that register exit handlers (logging,
    used by the long-running commands; torch)."""
    code = None
    if sys.argv[1:2] == ["submit"]:  # the short way, where it can go (queueclient.thin)
        from gpuwarden.queueclient.thin import submit

        try:
            code = submit(sys.argv[2:])
        except KeyboardInterrupt:
            code = 130
    elif sys.argv[1:2] == ["queue"]:  # the service's table as it comes (queueclient.thinqueue)
        from gpuwarden.queueclient.thinqueue import queue

        try:
            code = queue(sys.argv[2:])
        except KeyboardInterrupt:
            code = 130
        except BrokenPipeError:  # `gpuwarden queue --all | head`: the reader left
            sys.stderr.close()
            code = 0
    if code is None:
        code = main()
    threading = sys.modules.get("threading")
    if (
        (threading is None or threading.active_count() == 1)
        and "logging" not in sys.modules
        and "torch" not in sys.modules
    ):
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        except (OSError, ValueError):  # a closed or broken stream: the normal exit copes
            raise SystemExit(code) from None
        os._exit(code & 0xFF)
    raise SystemExit(code)


def parse(argv: list[str]) -> "tuple[ModuleType | None, argparse.Namespace]":
    """(the command's module, the parsed arguments), or (None, ...) when there is
    nothing to run (--version, no command). Exits as argparse does on help and errors."""
    from gpuwarden.cli.parsers import top_parser

    parser, commands = top_parser(COMMANDS, LOG_LEVELS)
    word, unknown = command_word(argv)
    if unknown is not None:
        parser.error(f"unrecognized option {unknown!r} (global options go before COMMAND)")
    module = None
    if word is not None:
        if word not in COMMANDS:
            parser.error(f"unknown command {word!r}{_did_you_mean(word)}")
        name = f"gpuwarden.cli.{COMMANDS[word][0]}"
        __import__(name)  # not importlib.import_module: importlib is not loaded otherwise
        module = sys.modules[name]
        module.register(commands, word)
    args, extra = parser.parse_known_args(argv)
    if extra:  # the command's own usage line, not the top-level one
        where = commands.choices[word] if word is not None else parser
        where.error(f"unrecognized arguments: {' '.join(extra)}")
    if args.version:
        from gpuwarden import __version__

        print(f"gpuwarden {__version__}")
        return None, args
    if module is None:
        parser.print_help()
        return None, args
    if args.sim is not None:
        os.environ["GPUWARDEN_SIM"] = args.sim
    return module, args


def service_client() -> "Client":
    """The queue service this command talks to, at the socket its reading of the
    configuration names; one line where none answers."""
    from gpuwarden import config
    from gpuwarden.queueclient.client import require

    return require(config.load().service_socket())


def configure_logging(level: "str | None") -> None:
    """One format for every long-running command: `LEVEL gpuwarden.AREA: message` on
    stderr, where a service manager's journal keeps it. The level comes from
    `--log-level`, else GPUWARDEN_LOG_LEVEL, else info; a bad variable is one line."""
    import logging

    from gpuwarden.base.errors import UserError

    if level is None:
        level = os.environ.get("GPUWARDEN_LOG_LEVEL", "info").strip().lower() or "info"
        if level not in LOG_LEVELS:
            raise UserError(
                f"GPUWARDEN_LOG_LEVEL={level!r}: expected one of {', '.join(LOG_LEVELS)}"
            )
    logging.basicConfig(
        level=level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )


def _did_you_mean(command: str) -> str:
    """`; did you mean 'status'?` for `stauts`, else the list of commands."""
    import difflib

    close = difflib.get_close_matches(command, list(COMMANDS), n=1, cutoff=0.6)
    if close:
        return f"; did you mean {close[0]!r}?"
    return f" (choose from {', '.join(COMMANDS)})"
