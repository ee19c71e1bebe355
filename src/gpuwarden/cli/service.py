"""`gpuwarden service install|uninstall|status|reload`: the queue service for admins
(docs/service.md)."""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    import argparse
    from typing import Any

    from gpuwarden.cli import Commands

NOT_RUNNING = 3  # as `systemctl status` for a stopped unit


def register(commands: Commands, name: str) -> None:
    from gpuwarden.cli import subcommand

    parser = subcommand(commands, name)
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    install = actions.add_parser(
        "install", help="install the unit, directories and a commented config, and start it"
    )
    install.add_argument(
        "--root",
        metavar="DIR",
        help="install under this prefix instead of / (packagers, tests); implies --no-start",
    )
    install.add_argument(
        "--no-start", action="store_true", help="write everything but do not start the service"
    )
    install.add_argument(
        "--exporter", action="store_true", help="also the Prometheus exporter's unit (9400)"
    )
    install.add_argument(
        "--web", action="store_true", help="also the web page's unit (127.0.0.1:9500)"
    )
    uninstall = actions.add_parser("uninstall", help="stop it and remove what install made")
    uninstall.add_argument("--root", metavar="DIR", help="the prefix given to install")
    uninstall.add_argument(
        "--purge",
        action="store_true",
        help="also remove the job journal, the install record, drains and XID log",
    )
    uninstall.add_argument(
        "--force", action="store_true", help="with --purge: even while jobs are queued"
    )
    status = actions.add_parser("status", help="is it running, where, which version, its queue")
    status.add_argument("--socket", metavar="PATH", help="the service's socket (service.socket)")
    status.add_argument("--json", action="store_true", help="print a JSON object")
    reload = actions.add_parser(
        "reload", help="read [service] and [enforce] again, without a restart (admins)"
    )
    reload.add_argument("--socket", metavar="PATH", help="the service's socket (service.socket)")


def run(args: argparse.Namespace) -> int:
    if args.action == "install":
        return _install(args)
    if args.action == "uninstall":
        return _uninstall(args)
    if args.action == "reload":
        return _reload(args)
    return _status(args)


def _install(args: argparse.Namespace) -> int:
    from gpuwarden.service import install

    root = _root(args.root)
    companions = tuple(c for c in ("exporter", "web") if getattr(args, c, False))
    for line in install.install(root, companions=companions):
        print(line)
    if root != "/" or args.no_start:
        print("not started (--root or --no-start)")
        return 0
    if not install.systemd_running():
        print(
            "systemd is not running on this machine (PID 1 is not systemd), so nothing was "
            "started; start the service by hand as root:\n"
            "  gpuwarden serve &        (or under your process supervisor; logs go to stderr)"
        )
        return 0
    _systemctl(install.start_commands(companions))
    from gpuwarden.queueclient.probe import wait_until_running

    found = wait_until_running(_socket(None), 15.0)  # the configured socket, as it reads
    if not found["running"]:
        print(
            f"started, but nothing answers on {found['socket']} after 15 s: "
            f"{found['error']}; see `journalctl -u gpuwarden`"
        )
        return 1
    print(f"started: it answers on {found['socket']} (`gpuwarden service status`)")
    return 0


def _uninstall(args: argparse.Namespace) -> int:
    from gpuwarden.base.errors import UserError
    from gpuwarden.queueclient.probe import probe
    from gpuwarden.service import install, uninstall

    root = _root(args.root)
    if root == "/" and install.systemd_running():
        _systemctl(install.stop_commands(root), check=False)
    found = probe(_socket(None))  # the configured socket, as every command reads it
    if found["running"]:
        # Removing the unit and directories of a running service would strand its jobs'
        # clients and leave a service nobody can stop by its unit.
        raise UserError(
            f"the service still answers at {found['socket']}: stop it first "
            "(`systemctl stop gpuwarden`, or end `gpuwarden serve`); nothing was removed"
        )
    if args.force and not args.purge:
        raise UserError("--force only applies with --purge")
    for line in uninstall.uninstall(root, purge=args.purge, force=args.force):
        print(line)
    return 0


def _reload(args: argparse.Namespace) -> int:
    """Ask the service to read its policy again; print what changed (as its log does)."""
    from gpuwarden.queueclient.client import require

    with require(_socket(args.socket)) as client:
        changed = client.call("reload")["changes"]
    for line in changed:
        print(line)
    print("reloaded: " + (f"{len(changed)} change(s)" if changed else "no change"))
    return 0


def _socket(given: str | None) -> str:
    """--socket, else the configured one."""
    from gpuwarden import config

    return given or config.load().service_socket()


def _root(value: str | None) -> str:
    import os

    from gpuwarden.base.errors import UserError

    if value is None:
        return "/"
    if not value or "\0" in value:
        raise UserError("--root needs a directory")
    root = os.path.abspath(value)
    if os.path.exists(root) and not os.path.isdir(root):
        raise UserError(f"--root {value}: not a directory")
    return root


def _systemctl(commands: list[list[str]], check: bool = True) -> None:
    import subprocess

    from gpuwarden.base.errors import UserError

    for argv in commands:
        print("$ " + " ".join(argv))
        try:
            done = subprocess.run(argv, capture_output=True, text=True, timeout=120)
        except (OSError, subprocess.TimeoutExpired) as err:
            raise UserError(f"{argv[0]} failed: {err}") from None
        if done.returncode != 0 and check:
            why = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["no output"]
            raise UserError(f"`{' '.join(argv)}` failed: {why[0]}")


def _status(args: argparse.Namespace) -> int:
    import json

    from gpuwarden.queueclient.probe import probe

    found = probe(_socket(args.socket))
    if args.json:
        print(json.dumps(found, indent=2))
    else:
        print(_text(found))
    return 0 if found["running"] else NOT_RUNNING


def _text(found: dict[str, Any]) -> str:
    sock = found["socket"]
    if not found["running"]:
        return f"not running: {found['error']} ({sock})"
    lines = [f"running: answers on {sock}"]
    ours, theirs = found["client_version"], found["version"]
    if found.get("error"):  # a version it does not share with us
        lines.append(f"protocol: {found['error']}")
    else:
        lines.append(f"protocol: version {theirs} (this gpuwarden: {ours})")
    if found.get("user") is not None:
        role = "an admin" if found.get("admin") else "not an admin"
        lines.append(f"you: {found['user']} ({role})")
    counts = found.get("jobs")
    if counts is not None:
        parts = [f"{n} {state.lower()}" for state, n in sorted(counts.items())]
        lines.append("jobs: " + (", ".join(parts) if parts else "none queued or running"))
    return "\n".join(lines)
