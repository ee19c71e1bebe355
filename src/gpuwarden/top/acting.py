"""A confirmed action, carried out as the user: through the queue service's socket on
this machine (the service names the user from the kernel and refuses what is not
theirs to do, with its reason), over the user's ssh as `gpuwarden cancel ...` on
another host, and drains through `gpuwarden drain`, which admits only admins. The
outcome is one line for the view's message: what was done, or the refusal."""

from __future__ import annotations

import subprocess
import sys

from gpuwarden.base.errors import UserError
from gpuwarden.top.model import Action

DONE = {
    "cancel": "cancelled",
    "hold": "held",
    "release": "released",
    "requeue": "requeued (it runs again, ended first if it runs):",
    "drain": "drained GPU",
    "undrain": "undrained GPU",
}
#: The command line's words for each action (on another host, and for drains here).
WORDS = {"cancel": "cancel", "hold": "hold", "release": "unhold", "requeue": "requeue"}


def perform(action: Action, socket: str) -> str:
    """Do `action` (through the queue service at `socket`, or a command); one line
    saying what came of it."""
    try:
        if action.host is not None or action.op in ("drain", "undrain"):
            return _command(action)
        return _service(action, socket)
    except UserError as err:
        return f"refused: {err}"


def _service(action: Action, socket: str) -> str:
    from gpuwarden.queueclient.client import require

    name: int | str = int(action.target) if action.target.isdigit() else action.target
    with require(socket) as client:
        if action.op == "requeue":
            if not isinstance(name, int):
                raise UserError("requeue names one job by its id")
            client.call("requeue", job=name)
            return f"{DONE['requeue']} job {name}"
        reply = client.call(action.op, jobs=[name])
    refused = reply.get("refused") or ()
    if refused:
        return f"refused: {refused[0].get('error')}"
    done = reply.get("names") or reply.get("jobs") or [name]
    return f"{DONE[action.op]} {', '.join(str(n) for n in done)}"


def _command(action: Action) -> str:
    """`gpuwarden WORD TARGET` here (drains) or on the action's host over ssh."""
    if action.op in ("drain", "undrain"):
        argv = [action.op, action.target]
        if action.reason:
            argv += ["--reason", action.reason]
    else:
        word = WORDS.get(action.op)
        if word is None:
            raise UserError(f"{action.op} is done on this machine only")
        argv = [word, action.target]
    if action.host is None:
        done = subprocess.run(
            [sys.executable, "-m", "gpuwarden", *argv],
            capture_output=True,
            text=True,
            timeout=60,
            stdin=subprocess.DEVNULL,
        )
        ok, said = done.returncode == 0, (done.stderr or done.stdout).strip().splitlines()
        why = said[-1] if said else f"exit status {done.returncode}"
    else:
        from gpuwarden.hosts.remote import run_on, settings

        command, timeout, options = settings()
        reply = run_on(action.host, [*command, *argv], timeout, options)
        ok, why = reply.ok, reply.error
    if ok:
        return f"{DONE[action.op]} {action.target}" + (f" on {action.host}" if action.host else "")
    return f"refused: {why.removeprefix(f'gpuwarden {argv[0]}: ')}"
