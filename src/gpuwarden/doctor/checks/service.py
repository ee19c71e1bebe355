"""The queue service: does one run, can this user reach it, does it speak our protocol,
and, on a machine that shares a world-writable lease directory, should one run?

A lease directory every user can write (the sticky 1777 /var/lib/gpuwarden/leases)
protects jobs from accidents, not from a user: anyone can open a GPU's lock file
and hold its lock, and everyone else's jobs wait behind it (docs/leases.md,
docs/health.md). Only a service that owns the directory can close that.
"""

from __future__ import annotations

from typing import Any

from gpuwarden.doctor.facts import Facts
from gpuwarden.doctor.findings import FAIL, INFO, PASS, WARN, Finding

NAME = "service"
INSTALL = "sudo gpuwarden service install  (docs/service.md)"
RESTART = "sudo systemctl restart gpuwarden, then journalctl -u gpuwarden for why it stopped"


def check_service(facts: Facts) -> list[Finding]:
    found = facts.service
    if found is None:
        return []
    sock = found.get("socket") or "the service's socket"
    problem = found.get("problem")
    if found.get("running") and problem is None:
        return [_answers(found, sock), *_release(found)]
    if problem == "other-version":
        theirs = found.get("version")
        return [
            Finding(
                "service.version",
                FAIL,
                f"the service at {sock} speaks protocol {theirs if theirs is not None else '?'}"
                f", this gpuwarden speaks {found.get('client_version')}: commands that need "
                "the service will be refused",
                str(found.get("error") or ""),
                "use the gpuwarden release the service runs (or an admin upgrades the service "
                "to this one and restarts it: sudo systemctl restart gpuwarden)",
            )
        ]
    if problem == "denied":
        return [
            Finding(
                "service.access",
                FAIL,
                f"a service socket is at {sock}, but this user may not open it",
                str(found.get("error") or ""),
                "an admin restores the modes (directory 0755, socket 0666; the kernel tells "
                "the service who connects): sudo systemd-tmpfiles --create "
                "/etc/tmpfiles.d/gpuwarden.conf && sudo systemctl restart gpuwarden",
            )
        ]
    if problem != "absent":
        return [
            Finding(
                "service",
                WARN,
                f"something is at {sock}, but no service answers there",
                str(found.get("error") or ""),
                RESTART,
            )
        ]
    return [_absent(facts, sock)]


def _answers(found: Any, sock: str) -> Finding:
    who = found.get("user") or "you"
    role = ", an admin" if found.get("admin") else ""
    jobs = found.get("jobs") or {}
    queued = ", ".join(f"{n} {state.lower()}" for state, n in sorted(jobs.items()))
    return Finding(
        NAME,
        PASS,
        f"the gpuwarden service answers at {sock} (protocol {found.get('version')}, "
        f"the same as this gpuwarden) and knows you as {who}{role}",
        f"jobs: {queued or 'none queued or running'}",
    )


def install_line(wheels: str, release: str = "") -> str:
    """The command that puts the service's own gpuwarden into this user's venv (the
    active one, else the one named by the Python running this). `release`: the
    service's, where this venv has another one (pip leaves an installed gpuwarden
    as it is unless the line names the one it wants)."""
    import os
    import sys

    venv = os.environ.get("VIRTUAL_ENV")
    python = os.path.join(venv, "bin", "python") if venv else "~/venv/bin/python"
    own = os.path.isdir(os.path.join(sys.prefix, "share", "gpuwarden", "wheels"))
    if sys.prefix != sys.base_prefix and not own:
        python = sys.executable  # a venv of the user's own is running this
    wanted = f"gpuwarden=={release}" if release else "gpuwarden"
    line = f"{python} -m pip install --no-index --find-links {wheels}"
    if any(name.startswith("pip-") for name in _listed(wheels)):
        # pip 25 or later first: it writes gpuwarden's console script without the
        # `import re` of an older pip's (~10 ms on every command); a no-op where it is
        return f"{line} 'pip>=25' && {line} {wanted}"
    return f"{line} {wanted}"


def _listed(folder: str) -> list[str]:
    import os

    try:
        return os.listdir(folder)
    except OSError:
        return []


def _release(found: Any) -> list[Finding]:
    """The service's release against this one, and the line that matches them."""
    from gpuwarden import __version__

    theirs, wheels = found.get("release"), found.get("wheels")
    if not isinstance(wheels, str):
        wheels = None
    if isinstance(theirs, str) and theirs != __version__:
        fix = install_line(wheels, theirs) if wheels else "install the gpuwarden the service runs"
        return [
            Finding(
                "service.release",
                WARN,
                f"this gpuwarden is {__version__}, the service's is {theirs}",
                "the protocol matches; what each says of the other may not",
                fix,
            )
        ]
    if wheels is None:
        return []
    return [
        Finding(
            "service.client",
            INFO,
            "gpuwarden for your own venv (JupyterLab, torch, submitit), as the service's",
            f"gpuwarden {__version__} and its dependencies in {wheels}",
            install_line(wheels),
        )
    ]


def _absent(facts: Facts, sock: str) -> Finding:
    if (facts.service or {}).get("installed"):
        # Installed, so never "install it"; stopped, so nothing queues and the leases
        # (root's) are closed to the commands working alone.
        return Finding(
            "service.stopped",
            WARN,
            "the gpuwarden service is installed here but not running: jobs cannot be "
            "queued, and run and reserve refuse (the leases are the service's)",
            f"no service answers at {sock}",
            "ask an admin to start it: sudo systemctl start gpuwarden "
            "(journalctl -u gpuwarden says why it stopped)",
        )
    if facts.lease_dir_shared:
        return Finding(
            "service.recommended",
            WARN,
            f"no gpuwarden service runs, and every user shares the lease directory "
            f"{facts.lease_dir}, which any of them can write: one user can hold its lock "
            "files and block everyone's jobs",
            f"no socket at {sock}; {facts.lease_dir} is sticky and world-writable",
            INSTALL + ": the service owns the leases (0755, root) and the queue",
        )
    return Finding(
        NAME,
        INFO,
        "no gpuwarden service runs: commands work alone (fine for a machine one person uses)",
        f"no socket at {sock}",
    )
