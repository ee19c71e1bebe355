"""`gpuwarden enforce`: apply the [enforce] policies to the current leases.

`--once` (the default) reads the machine once and reports; `--watch` keeps reading
every `enforce.poll_seconds`, which lets the graces run out. Every action is a line
on stderr (logging). Signals (kill, release) are sent only as root; otherwise the
line says the process was left alone. Exit status of `--once`: 0 nothing found,
1 something reported.
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    import argparse

    from gpuwarden.cli import Commands


def register(commands: Commands, name: str) -> None:
    from gpuwarden.cli import subcommand

    parser = subcommand(commands, name)
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--once", action="store_true", help="read once, report and act (default)")
    group.add_argument(
        "--watch", action="store_true", help="keep reading every enforce.poll_seconds"
    )


def run(args: argparse.Namespace) -> int:
    import os
    import time

    from gpuwarden.config import load
    from gpuwarden.leases import list_leases
    from gpuwarden.machine.inventory import read_snapshot
    from gpuwarden.monitoring.enforcer import Enforcer
    from gpuwarden.usage.enforcement import EnforceSettings

    conf = load()
    enforcer = Enforcer(EnforceSettings.from_config(conf))
    interval = conf.get("enforce.poll_seconds")
    root = os.geteuid() == 0
    while True:
        now = time.time()
        actions = enforcer.step(read_snapshot(), list_leases(), now)
        enforcer.carry_out(actions, now, may_signal=root)
        if not args.watch:
            return 1 if actions else 0
        time.sleep(max(0.0, interval - (time.time() - now)))
