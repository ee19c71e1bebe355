"""`gpuwarden mcp`: a Model Context Protocol server on stdin/stdout for coding assistants,
as the user who starts it (docs/mcp.md). Needs the `mcp` extra."""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    import argparse

    from gpuwarden.cli import Commands


def register(commands: Commands, name: str) -> None:
    from gpuwarden.cli import subcommand

    parser = subcommand(
        commands,
        name,
        epilog="An assistant starts it itself: add `gpuwarden mcp` to its MCP servers "
        "(docs/mcp.md has each one's lines).",
    )
    parser.add_argument(
        "--socket",
        metavar="PATH",
        help="the queue service's socket (default: the configured service.socket)",
    )


def run(args: argparse.Namespace) -> int:
    from gpuwarden.base.errors import UserError

    try:
        import mcp  # noqa: F401
    except ImportError:
        raise UserError("gpuwarden mcp needs the MCP SDK: pip install 'gpuwarden[mcp]'") from None
    import sys

    if sys.stdin.isatty():
        print(
            "gpuwarden mcp: serving MCP on stdin/stdout; an assistant starts this itself "
            "(docs/mcp.md). Ctrl-D ends it.",
            file=sys.stderr,
        )
    from gpuwarden import config
    from gpuwarden.assistant.server import serve

    serve(args.socket or config.load().service_socket())
    return 0
