"""An interpreter another Unix user may run with the suite's packages."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

from components import require
from repo import SRC


def python_for(user: str) -> tuple[list[str], str]:
    """An interpreter `user` may run with this test's packages, and its PYTHONPATH: this
    one where she can reach it (CI: a venv on the system's python), else the system's
    python3 of the same version with this one's site-packages (a venv whose python
    links into root's home, as here)."""
    import site

    ours = os.pathsep.join(p for p in (str(SRC), os.environ.get("PYTHONPATH")) if p)
    theirs = os.pathsep.join([ours, *site.getsitepackages()])
    version = f"python{sys.version_info[0]}.{sys.version_info[1]}"
    tries = [([sys.executable], ours)]
    system = shutil.which(version, path="/usr/bin:/bin")
    if system:
        tries.append(([system], theirs))
    for python, path in tries:
        probe = subprocess.run(
            ["runuser", "-u", user, "--", *python, "-c", "import gpuwarden, pynvml"],
            env={**os.environ, "PYTHONPATH": path},
            capture_output=True,
            timeout=60,
        )
        if probe.returncode == 0:
            return python, path
    require(False, f"no python {user} may run with gpuwarden's packages")
    raise AssertionError("unreachable")
