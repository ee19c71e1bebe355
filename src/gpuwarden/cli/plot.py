"""`gpuwarden plot FILE.csv -o usage.png`: draw a recording."""

from __future__ import annotations

TYPE_CHECKING = False  # argparse is read only by type checkers here
if TYPE_CHECKING:
    import argparse

    from gpuwarden.cli import Commands


def register(commands: Commands, name: str) -> None:
    from gpuwarden.cli import subcommand

    parser = subcommand(commands, name)
    parser.add_argument(
        "files", nargs="+", metavar="FILE.csv", help="recordings (rotated parts too, any order)"
    )
    parser.add_argument(
        "-o", "--output", default="usage.png", help="picture to write (.png, .svg, .pdf)"
    )
    parser.add_argument("--title", help="title above the picture")


def run(args: argparse.Namespace) -> int:
    from gpuwarden.monitoring.plot import plot_files

    out = plot_files(args.files, args.output, args.title)
    print(f"wrote {out}")
    return 0
