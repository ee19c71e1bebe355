"""`gpuwarden slurm cluster HOST... --check`, the gathering: each host's `gpuwarden
slurm facts` over ssh, all at once, judged by gpuwarden.slurm.preflight; one line per
problem, exit 1.

The gathering is thin on purpose: one ssh per host (the user's own ssh, as for
`--hosts`), this machine's clock read just before and after each, and a munge
credential made here for every host to decode (it decodes only with the same key).
"""

from __future__ import annotations

import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Optional

TYPE_CHECKING = False
if TYPE_CHECKING:
    import argparse


def credential() -> Optional[str]:
    """A fresh munge credential from munged here, or None where none answers."""
    try:
        done = subprocess.run(
            ["munge", "-n"], capture_output=True, text=True, timeout=10, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    made = done.stdout.strip()
    ok = done.returncode == 0 and made.startswith("MUNGE:") and len(made) < 4096
    return made if ok and made.isprintable() and " " not in made else None


def check(args: argparse.Namespace) -> int:
    from gpuwarden.files.safefiles import printable
    from gpuwarden.hosts import remote
    from gpuwarden.slurm import cluster, preflight

    for path in args.path:
        cluster.check_path("--path", path)
    cluster.check_path("--munge-key", args.munge_key)
    command, timeout, options = remote.settings()
    argv = [
        *command,
        *("slurm", "facts", f"--conf-dir={args.conf_dir}", f"--dev-dir={args.dev_dir}"),
        f"--munge-key={args.munge_key}",
        *(f"--path={p}" for p in args.path),
    ]
    made = credential()
    if made:
        argv.append(f"--credential={made}")
    hosts = list(dict.fromkeys(args.hosts))

    def ask(host: str) -> tuple[str, float, Any, float]:
        asked = time.time()
        reply = remote.run_on(host, argv, timeout, options)
        return host, asked, reply, time.time()

    with ThreadPoolExecutor(max_workers=max(1, min(remote.PARALLEL, len(hosts)))) as pool:
        answers = list(pool.map(ask, hosts))
    lines, found = [], []
    for host, asked, reply, answered in answers:
        doc, why = remote.parse_json(reply)
        why = why or preflight.checked(doc) or ""
        if why or doc is None:
            lines.append(f"{host}: not checked: {why}")
        else:
            found.append(preflight.Host(host, doc, asked, answered))
    lines += preflight.problems(found, args.munge_key, args.cgroup)
    for line in lines:
        print(printable(line))
    if lines:
        print(
            f"gpuwarden slurm: {len(lines)} problem(s) across {len(hosts)} host(s): "
            "fix them before starting Slurm",
            file=sys.stderr,
        )
        return 1
    paths = f", {len(args.path)} path(s)" if args.path else ""
    print(
        f"{len(found)} hosts agree: users, munge key{paths}, clocks, Slurm release, "
        "cgroup version, gres.conf"
    )
    return 0
