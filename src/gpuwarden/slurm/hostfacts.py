"""What one host says about itself for `gpuwarden slurm cluster --check`: its users,
munge, the paths the admin named, its clock, Slurm and cgroup versions and its GPUs
(`gpuwarden slurm facts`, one JSON document read over ssh).

Only reads, and nothing here judges: gpuwarden.slurm.preflight compares the hosts'
documents. Every probe that fails says why in its own field rather than failing the
document, so one host's missing munge is one line of the check, not a lost host.
"""

from __future__ import annotations

import hashlib
import os
import pwd
import stat
import subprocess
import time
from collections.abc import Sequence
from typing import Any, Optional

SCHEMA = 1
#: Login accounts (uid 1000 up, below nobody's 65534) and the daemons' own accounts
#: whose ids Slurm carries between hosts.
FIRST_UID, NOBODY = 1000, 65534
DAEMONS = ("slurm", "munge")


def users() -> list[list[Any]]:
    """[name, uid, gid, home] of every login account and of the daemons' accounts,
    through NSS (local files, LDAP, sssd alike), as slurmd resolves them."""
    out = []
    for entry in pwd.getpwall():
        if entry.pw_name in DAEMONS or FIRST_UID <= entry.pw_uid < NOBODY:
            out.append([entry.pw_name, entry.pw_uid, entry.pw_gid, entry.pw_dir])
    return sorted(out)


def missing_homes(accounts: Sequence[Sequence[Any]]) -> list[str]:
    """The accounts whose home is not a directory here (a job starts in it, and reads
    its dotfiles and its ~/.cache there)."""
    return sorted(name for name, _, _, home in accounts if not os.path.isdir(home))


def _run(argv: Sequence[str], stdin: Optional[str] = None) -> tuple[bool, str]:
    """(succeeded, its stdout or its last words) of a short command."""
    try:
        done = subprocess.run(
            list(argv), input=stdin, capture_output=True, text=True, timeout=10, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as err:
        return False, getattr(err, "strerror", None) or str(err)
    if done.returncode != 0:
        lines = [x for x in (done.stderr + done.stdout).splitlines() if x.strip()]
        return False, (lines[-1].strip() if lines else f"exit status {done.returncode}")[:200]
    return True, done.stdout


def munge(key_file: str, credential: Optional[str]) -> dict[str, Any]:
    """The key's SHA-256 where this user may read it (root), whether munged answers
    (`munge -n`), and whether it decodes `credential` (made by munged on the checking
    machine: it decodes only with the same key)."""
    found: dict[str, Any] = {"key_sha256": None, "key_error": ""}
    try:
        with open(key_file, "rb") as f:
            found["key_sha256"] = hashlib.sha256(f.read(1 << 20)).hexdigest()
    except OSError as err:
        found["key_error"] = err.strerror or str(err)
    ok, said = _run(["munge", "-n"])
    found["answering"], found["error"] = ok, "" if ok else said
    found["decoded"], found["decode_error"] = None, ""
    if credential and ok:
        decoded, said = _run(["unmunge"], stdin=credential)
        found["decoded"], found["decode_error"] = decoded, "" if decoded else said
    return found


def paths(names: Sequence[str]) -> dict[str, str]:
    """Each path: "dir", "missing", "not a directory" or why it cannot be seen."""
    out = {}
    for name in names:
        try:
            st = os.stat(name)
        except FileNotFoundError:
            out[name] = "missing"
        except OSError as err:
            out[name] = err.strerror or str(err)
        else:
            out[name] = "dir" if stat.S_ISDIR(st.st_mode) else "not a directory"
    return out


def slurm_version() -> Optional[str]:
    """`slurmd -V` ("slurm-wlm 22.05.8" on Debian), else None: no slurmd here."""
    for slurmd in ("slurmd", "/usr/sbin/slurmd"):
        ok, said = _run([slurmd, "-V"])
        if ok and said.strip():
            return said.strip().splitlines()[0][:80]
    return None


def cgroup_version(root: str = "/sys/fs/cgroup") -> str:
    """ "v2" (cgroup2 at the root), "v1", or "hybrid" (v1 with a unified mount beside)."""
    try:
        kind = _fs_type(root)
    except OSError:
        return "none"
    if not kind:
        return "none"
    if kind == "cgroup2":
        return "v2"
    return "hybrid" if os.path.isdir(os.path.join(root, "unified")) else "v1"


def _fs_type(path: str) -> str:
    """The file system type mounted at `path`, from /proc/self/mounts."""
    found = ""
    with open("/proc/self/mounts", encoding="utf-8", errors="replace") as f:
        for line in f:
            words = line.split()
            if len(words) > 2 and words[1] == path:
                found = words[2]
    return found


def gres_conf(conf_dir: str, node: str) -> Optional[list[str]]:
    """The GPU lines of this node in an existing gres.conf (lines naming no node, or
    this one, without the NodeName= word), or None where there is no gres.conf."""
    try:
        with open(os.path.join(conf_dir, "gres.conf"), encoding="utf-8", errors="replace") as f:
            text = f.read(1 << 20)
    except OSError:
        return None
    out = []
    for raw in text.splitlines():
        line = raw.split("#", 1)[0].strip()
        words = line.split()
        named = [w for w in words if w.startswith("NodeName=")]
        if named and named[0] != f"NodeName={node}":
            continue
        rest = [w for w in words if not w.startswith("NodeName=")]
        if rest and rest[0] == "Name=gpu":
            out.append(" ".join(rest))
    return out


def read(
    names: Sequence[str], key_file: str, credential: Optional[str], conf_dir: str, dev_dir: str
) -> dict[str, Any]:
    """This host's whole document (`gpuwarden slurm facts`)."""
    from gpuwarden.base.errors import UserError
    from gpuwarden.slurm import facts

    node = os.uname().nodename.split(".", 1)[0]
    found_users = users()
    try:
        gpus: Any = facts.read(dev_dir)
        gpu_error = ""
    except UserError as err:
        gpus, gpu_error = None, str(err)
    return {
        "schema": SCHEMA,
        "node": node,
        "time": time.time(),
        "users": found_users,
        "missing_homes": missing_homes(found_users),
        "munge": munge(key_file, credential),
        "paths": paths(names),
        "slurm": slurm_version(),
        "cgroup": cgroup_version(),
        "gres_lines": None if gpus is None else gpus["gres_lines"],
        "gres_conf": gres_conf(conf_dir, node),
        "gpu_error": gpu_error,
    }
