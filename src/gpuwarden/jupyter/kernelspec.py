"""The Jupyter kernelspec `gpuwarden kernel install` writes (docs/notebooks.md).

A kernelspec is a folder `kernels/NAME/` holding `kernel.json`; Jupyter finds it in the
user's data directory (`~/.local/share/jupyter`), under a `--prefix` (an environment's
`share/jupyter`) or `--sys-prefix`. Ours starts ipykernel as usual and names the
gpuwarden provisioner (gpuwarden.jupyter.provisioner) with the GPU request, so each kernel
started from it leases its GPUs. Writing it needs no Jupyter installed here: the
provisioner needs `jupyter_client` where the kernels start (`gpuwarden[jupyter]`).
"""

from __future__ import annotations

import json
import os
import re

from gpuwarden.base.errors import UserError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping
    from typing import Any, Optional

PROVISIONER = "gpuwarden"  # the jupyter_client.kernel_provisioners entry point's name
_NAME = re.compile(r"^[a-z0-9._-]{1,64}$")  # what Jupyter accepts as a kernel name


def default_name(request: Mapping[str, Any]) -> str:
    """`gpuwarden-1gpu`, `gpuwarden-2gpu`, `gpuwarden-10gib` (a share), from the request."""
    if request.get("mem"):
        return "gpuwarden-" + re.sub(r"[^a-z0-9.]", "", str(request["mem"]).lower())
    return f"gpuwarden-{request.get('n') or 1}gpu"


def display_name(request: Mapping[str, Any]) -> str:
    """What JupyterLab's kernel menu shows: `Python (1 GPU)`, `Python (10GiB of a GPU)`."""
    if request.get("mem"):
        return f"Python ({request['mem']} of a GPU)"
    if request.get("gpus") and not request.get("n"):
        return f"Python (GPU {request['gpus']})"
    n = int(request.get("n") or 1)
    return f"Python ({n} GPU{'s' if n != 1 else ''})"


def spec(
    request: Mapping[str, Any],
    python: str,
    display: Optional[str] = None,
    wait: bool = False,
    timeout: Optional[float] = None,
    uuid: bool = False,
    time_limit: Optional[float] = None,
    account: Optional[str] = None,
) -> dict[str, Any]:
    """kernel.json for `python`'s ipykernel with the gpuwarden provisioner and `request`
    (gpuwarden.lease()'s arguments, only those given); `time_limit` in seconds: the
    kernel's time under a queue service (gpuwarden.lease(time=...))."""
    config: dict[str, Any] = {"request": {k: v for k, v in request.items() if v is not None}}
    if time_limit is not None:
        config["time_limit"] = time_limit
    if account is not None:  # the account the service charges (gpuwarden.lease(account=))
        config["account"] = account
    if uuid:
        config["uuid"] = True
    if wait:
        config["wait_for_gpus"] = True
        if timeout is not None:
            config["wait_timeout"] = timeout
    return {
        "argv": [python, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": display or display_name(request),
        "language": "python",
        "metadata": {
            "debugger": True,
            "kernel_provisioner": {"provisioner_name": PROVISIONER, "config": config},
        },
    }


def kernels_dir(prefix: Optional[str] = None) -> str:
    """Where kernelspecs go: PREFIX/share/jupyter/kernels, else the user's Jupyter data
    directory (JUPYTER_DATA_DIR, else $XDG_DATA_HOME/jupyter or ~/.local/share/jupyter)."""
    if prefix is not None:
        return os.path.join(prefix, "share", "jupyter", "kernels")
    data = os.environ.get("JUPYTER_DATA_DIR")
    if not data:
        base = os.environ.get("XDG_DATA_HOME") or os.path.join(
            os.path.expanduser("~"), ".local", "share"
        )
        data = os.path.join(base, "jupyter")
    return os.path.join(data, "kernels")


def install(name: str, kernel: Mapping[str, Any], prefix: Optional[str] = None) -> str:
    """Write `kernels/NAME/kernel.json` (replacing one of the same name); its path."""
    if not _NAME.match(name):
        raise UserError(
            f"invalid kernel name {name!r}: use lower-case letters, digits, '.', '_' and '-'"
        )
    folder = os.path.join(kernels_dir(prefix), name)
    try:
        os.makedirs(folder, exist_ok=True)
        path = os.path.join(folder, "kernel.json")
        tmp = f"{path}.{os.getpid()}.tmp"
        with open(tmp, "w", encoding="utf-8") as fh:
            json.dump(kernel, fh, indent=1)
            fh.write("\n")
        os.replace(tmp, path)
    except OSError as err:
        raise UserError(f"cannot write the kernelspec in {folder}: {err.strerror}") from None
    return path


def uninstall(name: str, prefix: Optional[str] = None) -> str:
    """Remove kernelspec NAME if it is one of ours; the folder removed."""
    folder = os.path.join(kernels_dir(prefix), name)
    path = os.path.join(folder, "kernel.json")
    try:
        with open(path, encoding="utf-8") as fh:
            kernel = json.load(fh)
    except (OSError, ValueError):
        raise UserError(f"no kernelspec {name!r} in {kernels_dir(prefix)}") from None
    provisioner = (kernel.get("metadata") or {}).get("kernel_provisioner") or {}
    if provisioner.get("provisioner_name") != PROVISIONER:
        raise UserError(f"kernelspec {name!r} was not written by gpuwarden: left alone")
    try:
        for entry in os.listdir(folder):
            os.unlink(os.path.join(folder, entry))
        os.rmdir(folder)
    except OSError as err:
        raise UserError(f"cannot remove {folder}: {err.strerror}") from None
    return folder
