"""`gpuwarden doctor`: print findings (text or --json); exit 1 when any check FAILs."""

from __future__ import annotations

import sys
from typing import Any

TYPE_CHECKING = False  # argparse is read only by type checkers here
if TYPE_CHECKING:
    import argparse

    from gpuwarden.cli import Commands


def register(commands: Commands, name: str) -> None:
    from gpuwarden.cli import subcommand

    parser = subcommand(commands, name)
    parser.add_argument("--json", action="store_true", help="print findings and facts as JSON")
    parser.add_argument(
        "--verbose", "-v", action="store_true", help="also show what each passing check saw"
    )
    parser.add_argument(
        "--no-torch-import",
        action="store_true",
        help="do not start torch in a child process: read its version file only and take its "
        "architectures from the table of official wheels (fast)",
    )
    parser.add_argument(
        "--export",
        metavar="FILE",
        help="write an environment fingerprint (OS, Python, packages, torch/CUDA/cuDNN/NCCL, "
        "driver, GPUs, variables) to FILE: JSON if it ends in .json, else text; '-' = stdout",
    )
    parser.epilog = "Exit status: 0 when no check FAILs (WARN is still 0), 1 otherwise."


def run(args: argparse.Namespace) -> int:
    import os

    from gpuwarden.doctor.probe import start_if_wanted

    # Importing torch in the probe is the long pole: start it before importing
    # anything else of the doctor, so that all of that (and reading the machine)
    # happens while the child runs.
    probe = None if args.no_torch_import else start_if_wanted(os.environ)
    return _diagnose(args, probe)


def _diagnose(args: argparse.Namespace, probe: Any) -> int:
    from gpuwarden.doctor.facts import gather

    if args.export:
        from gpuwarden.base.errors import UserError
        from gpuwarden.doctor import fingerprint

        facts = gather(probe_torch=not args.no_torch_import, probe=probe)
        try:
            kind = fingerprint.export(facts, args.export)
        except OSError as exc:
            raise UserError(f"cannot write {args.export}: {exc.strerror or exc}") from None
        if args.export != "-":
            print(f"wrote {kind} fingerprint to {args.export}", file=sys.stderr)
        return 0
    from gpuwarden.doctor import report
    from gpuwarden.doctor.checks import run_checks
    from gpuwarden.doctor.findings import exit_code

    facts = gather(probe_torch=not args.no_torch_import, probe=probe)
    findings = run_checks(facts)

    if args.json:
        sys.stdout.write(report.as_json(facts, findings))
    else:
        sys.stdout.write(report.text(facts, findings, verbose=args.verbose))
    return exit_code(findings)
