"""Whether the program a unit starts can run: for every user (the service's unit, which
the students' shells run too), and with what its companions need (the exporter's
prometheus-client). `gpuwarden service install` refuses, naming the fix, before it
changes anything."""

from __future__ import annotations

import os
import stat
from typing import Optional


def cannot_export(exec_start: str) -> Optional[str]:
    """Why the exporter's unit could not run (its Python lacks prometheus-client, the
    `exporter` extra), with the exact fix; None when it can, or when that Python is not
    there to ask (a packager's `--root`)."""
    import subprocess

    words = exec_start.split()
    python = words[0]
    try:
        with open(python, "rb") as fh:
            first = fh.readline(4096)
    except OSError:
        return None
    if first.startswith(b"#!"):
        shebang = first[2:].decode("utf-8", "replace").split()
        if not shebang or not os.path.basename(shebang[0]).startswith("python"):
            return None
        python = shebang[0]
    try:
        found = subprocess.run(
            [python, "-c", "import prometheus_client"], capture_output=True, timeout=60
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    if found.returncode == 0:
        return None
    return (
        f"{python} has no prometheus-client, which the exporter needs; run "
        "scripts/install-system again (it installs it), or "
        f"`sudo {python} -m pip install prometheus-client`"
    )


def not_for_everyone(program: str) -> Optional[str]:
    """Why not every user may run `program` (the unit's ExecStart, which `run` and the
    students' shells run too), or None: each directory on the way to it and to its
    interpreter (a script's `#!`) must be searchable by all, and the files readable and
    executable by all. A venv linked to a Python in root's 0700 home gave every student
    `bad interpreter: Permission denied`."""
    seen = [program]
    try:
        with open(os.path.realpath(program), "rb") as fh:
            first = fh.readline(4096)
        if first.startswith(b"#!"):
            words = first[2:].decode("utf-8", "replace").split()
            if words:
                seen.append(words[0])
    except OSError as err:
        return f"{program} cannot be read ({err.strerror})"
    for path in seen:
        for step in _path_steps(path):
            try:
                mode = os.stat(step).st_mode
            except OSError as err:
                return f"{step} cannot be reached ({err.strerror})"
            wanted = stat.S_IXOTH | (0 if stat.S_ISDIR(mode) else stat.S_IROTH)
            if mode & wanted != wanted:
                return f"other users may not {'enter' if stat.S_ISDIR(mode) else 'run'} {step}"
    return None


def _path_steps(path: str) -> list[str]:
    """Every directory and link on the way to `path`, then what it finally names."""
    steps: list[str] = []
    current = os.path.abspath(path)
    for _ in range(40):  # links within links, bounded
        parts = current.split(os.sep)
        for i in range(2, len(parts)):
            steps.append(os.sep.join(parts[:i]) or os.sep)
        if not os.path.islink(current):
            break
        current = os.path.join(os.path.dirname(current), os.readlink(current))
    steps.append(os.path.realpath(path))
    return steps
