"""The torch probe: a child interpreter that imports torch and prints its build facts.

Importing torch is the long pole of `gpuwarden doctor` (1-3 s against ~0.1 s
for everything else), so the child is started first and the doctor does all
its other work while it runs. This module is therefore kept apart from
`facts` (its dataclasses, the inventory): the CLI imports only this, starts
the child, and then imports the rest. Nothing here imports torch.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from typing import TYPE_CHECKING, Optional

if TYPE_CHECKING:
    import subprocess

NO_TORCH_ENV = "GPUWARDEN_DOCTOR_NO_TORCH"
PROBE_TIMEOUT = 120.0

# Run in a child interpreter: prints torch's build facts as JSON without
# initialising CUDA (no is_available(), no device queries).
PROBE = r"""
import json, sys
out = {}
try:
    import torch
except Exception as e:
    print(json.dumps({"error": "import torch failed: %s: %s" % (type(e).__name__, e)}))
    sys.exit(0)
def safe(name, fn):
    try:
        out[name] = fn()
    except Exception as e:
        out.setdefault("errors", []).append("%s: %s" % (name, e))
safe("version", lambda: torch.__version__)
safe("cuda", lambda: torch.version.cuda)
safe("hip", lambda: getattr(torch.version, "hip", None))
def archs():
    flags = getattr(torch._C, "_cuda_getArchFlags", None)
    return (flags() or "").split() if flags else []
safe("arch_list", archs)
safe("distributed", lambda: torch.distributed.is_available())
safe("nccl", lambda: bool(torch.distributed.is_available()
                          and torch.distributed.is_nccl_available()))
def nccl_version():
    v = torch.cuda.nccl.version()
    return ".".join(str(p) for p in v) if isinstance(v, tuple) else str(v)
if torch.version.cuda:
    safe("nccl_version", nccl_version)
    safe("cudnn", lambda: torch.backends.cudnn.version())
safe("mps", lambda: torch.backends.mps.is_built())
print(json.dumps(out))
"""


def torch_location(environ: Mapping[str, str]) -> Optional[str]:
    """Where torch is installed (found without importing it), or None when it is not
    or when `GPUWARDEN_DOCTOR_NO_TORCH` says to treat it as absent."""
    if environ.get(NO_TORCH_ENV, "") not in ("", "0"):
        return None
    from importlib.util import find_spec

    try:
        spec = find_spec("torch")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    return next(iter(spec.submodule_search_locations))


def start(python: Optional[str] = None) -> subprocess.Popen[str]:
    """The probe, running; `facts.finish_probe` collects its answer."""
    import subprocess

    env = dict(os.environ)
    env.pop("PYTHONSTARTUP", None)
    return subprocess.Popen(
        [python or sys.executable, "-c", PROBE],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        text=True,
        env=env,
    )


def start_if_wanted(environ: Mapping[str, str]) -> Optional[subprocess.Popen[str]]:
    """The running probe when torch is there to be asked; None otherwise (also when
    the child cannot start: `facts.gather` then starts it again and reports why)."""
    if torch_location(environ) is None:
        return None
    try:
        return start()
    except OSError:
        return None
