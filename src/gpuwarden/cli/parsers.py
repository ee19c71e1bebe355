"""The `gpuwarden` command's argparse parsers: the top-level one with the global
options, and the class every command's parser is made of. Apart from `cli` itself so
that what needs no parser (a plain `submit`: `queueclient.thin`) imports no argparse.
"""

from __future__ import annotations

import argparse

TYPE_CHECKING = False  # the typing module is not needed at run time here
if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence
    from typing import Any

    # What a command's `register` is given: `commands.add_parser(...)` makes its parser.
    Commands = argparse._SubParsersAction[argparse.ArgumentParser]


_FORMATTER: list[type[argparse.HelpFormatter]] = []


def formatter() -> type[argparse.HelpFormatter]:
    """argparse's help formatter, told the terminal's width: left to find it itself,
    it imports shutil (with its compression modules) for every argument declared.
    The width is read once: argparse makes a formatter for each argument declared."""
    if _FORMATTER:
        return _FORMATTER[0]
    from gpuwarden.base.table import columns

    wide = columns() - 2

    class Formatter(argparse.HelpFormatter):
        def __init__(
            self,
            prog: str,
            indent_increment: int = 2,
            max_help_position: int = 24,
            width: int | None = None,
        ) -> None:
            width = wide if width is None else width
            super().__init__(prog, indent_increment, max_help_position, width)

    _FORMATTER.append(Formatter)
    return Formatter


class CommandParser(argparse.ArgumentParser):
    """Every command's parser, and the parsers nested in one (`sim inject xid`,
    `service install`: argparse makes those of their parent's class): no option
    may be abbreviated, and help is wrapped to the terminal.

    `intermixed=True` (through `subcommand`) lets positionals and options mix, as in
    `slurm cluster --out DIR gpu1 gpu2`: plain argparse fills all positionals in one
    run and would leave the hosts after an option unrecognised."""

    def __init__(self, *args: Any, intermixed: bool = False, **kwargs: Any) -> None:
        kwargs.setdefault("allow_abbrev", False)
        kwargs.setdefault("formatter_class", formatter())
        super().__init__(*args, **kwargs)
        self._intermixed = intermixed

    def parse_known_args(self, args: Any = None, namespace: Any = None) -> Any:
        # The subparsers action calls this; on some Python versions
        # parse_known_intermixed_args calls it back, hence the flag off meanwhile.
        if not self._intermixed:
            return super().parse_known_args(args, namespace)
        self._intermixed = False
        try:
            return self.parse_known_intermixed_args(args, namespace)
        finally:
            self._intermixed = True


class RawFormatter(argparse.RawDescriptionHelpFormatter):
    """For the top-level help, whose epilog is the pre-formatted command table."""

    def __init__(self, prog: str, **kwargs: int | None) -> None:
        from gpuwarden.base.table import columns

        kwargs.setdefault("width", columns() - 2)
        super().__init__(prog, **kwargs)  # type: ignore[arg-type]


def top_parser(
    commands: Mapping[str, tuple[str, str]], log_levels: Sequence[str]
) -> tuple[argparse.ArgumentParser, Commands]:
    """The global options, and the action each command registers its parser into;
    `commands` the command table (`cli.COMMANDS`) for the help's list."""
    lines = [f"  {name:<10} {summary}" for name, (_, summary) in commands.items()]
    parser = argparse.ArgumentParser(
        prog="gpuwarden",
        usage="gpuwarden [-h] [-V] [--sim SPEC] [--log-level LEVEL] COMMAND [ARGS...]",
        description="Pick, reserve, watch and diagnose NVIDIA GPUs on shared machines.",
        epilog="commands:\n" + "\n".join(lines) + "\n\nRun `gpuwarden COMMAND --help` for more.",
        formatter_class=RawFormatter,
        allow_abbrev=False,
    )
    parser.add_argument(
        "--sim",
        metavar="SPEC",
        help="use a simulated machine (bundled name or TOML path); same as GPUWARDEN_SIM",
    )
    parser.add_argument(
        "--log-level",
        metavar="LEVEL",
        choices=log_levels,
        help="what the long-running commands log (exporter, health --watch, web, serve, "
        "record, enforce): debug, info (default), warning or error; same as "
        "GPUWARDEN_LOG_LEVEL",
    )
    parser.add_argument("-V", "--version", action="store_true", help="print the version and exit")
    action = parser.add_subparsers(
        dest="command", metavar="COMMAND", help=argparse.SUPPRESS, parser_class=CommandParser
    )
    return parser, action  # type: ignore[return-value]
