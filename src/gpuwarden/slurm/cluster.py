"""A small lab's whole Slurm configuration from its nodes' own facts (pure, but for
`write`): slurm.conf, gres.conf, cgroup.conf, the prolog/epilog hooks and a README
with the steps an admin takes (munge key, where each file goes, start order).

The facts are each node's `gpuwarden slurm conf --json` (gpuwarden.slurm.facts), read
over ssh, so every value is checked as another machine's words before it becomes a
configuration line. Every line written has a comment saying why it is there. Nothing
is installed or restarted: the admin copies the files (README says where).
"""

from __future__ import annotations

import ipaddress
import os
import re
import shlex
import time
from collections.abc import Mapping, Sequence
from typing import Any, Optional

from gpuwarden.base.errors import UserError
from gpuwarden.base.records import record

_WORD = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,62}")
_GRES = re.compile(r"gpu(:[A-Za-z0-9_.]+)?:[0-9]+(,gpu(:[A-Za-z0-9_.]+)?:[0-9]+)*")
_GRES_LINE = re.compile(r"Name=gpu( [A-Za-z]+=[A-Za-z0-9_.,/:\[\]-]+)+")
_PATH = re.compile(r"/[A-Za-z0-9_./%+-]*")


@record
class Node:
    """One node's checked facts."""

    name: str  # NodeName: its short hostname
    address: str  # NodeAddr: where the controller reaches it
    cpus: int
    memory_mib: Optional[int]
    gres: str  # Gres= of its NodeName line
    gres_lines: tuple[str, ...]
    notes: tuple[str, ...]
    python: str  # the interpreter its gpuwarden runs under, for the hooks
    source: str


@record
class ClusterSettings:
    """What the command's options choose: names, the controller, paths, ports."""

    name: str = "lab"
    controller: str = ""  # the controller's short hostname
    controller_address: Optional[str] = None
    state_dir: Optional[str] = None
    conf_dir: str = "/etc/slurm"
    slurm_user: str = "slurm"
    port: int = 6817
    hook_env: str = "/etc/default/gpuwarden"
    slurmdbd: Optional[str] = None  # None: no accounting daemon
    cgroup: str = "autodetect"

    @staticmethod
    def parse(args: Any) -> ClusterSettings:
        """From `slurm cluster`'s options, each checked (one line per mistake)."""
        name, _, address = (args.controller or os.uname().nodename.split(".", 1)[0]).partition("=")
        _word("--name", args.name)
        _word("--controller", name)
        if address:
            _address("--controller", address)
        for flag, path in (("--state-dir", args.state_dir), ("--conf-dir", args.conf_dir)):
            if path is not None:
                _path(flag, path)
        _path("--hook-env", args.hook_env)
        _word("--slurm-user", args.slurm_user)
        if not 0 < args.port < 65533:
            raise UserError(
                f"--port needs a port 1-65532 (slurmd and slurmdbd take the next two), got "
                f"{args.port}"
            )
        if args.slurmdbd is not None:
            _word("--slurmdbd", args.slurmdbd)
            if args.no_slurmdbd:
                raise UserError("--slurmdbd names its host; --no-slurmdbd has none: not both")
        return ClusterSettings(
            name=args.name,
            controller=name,
            controller_address=address or None,
            state_dir=None if args.state_dir is None else args.state_dir.rstrip("/"),
            conf_dir=args.conf_dir.rstrip("/") or "/",
            slurm_user=args.slurm_user,
            port=args.port,
            hook_env=args.hook_env,
            slurmdbd=None if args.no_slurmdbd else (args.slurmdbd or name),
            cgroup=args.cgroup,
        )


def _word(flag: str, value: str) -> None:
    if not _WORD.fullmatch(value or ""):
        raise UserError(f"{flag} needs a name of letters, digits, '.', '_' or '-', got {value!r}")


def _address(flag: str, value: str) -> None:
    try:
        ipaddress.ip_address(value)
    except ValueError:
        _word(flag, value)


def check_path(flag: str, value: str) -> None:
    """An absolute path of plain characters (it goes into files and over ssh)."""
    if not _PATH.fullmatch(value or "") or len(value) > 500:
        raise UserError(f"{flag} needs an absolute path without spaces or quotes, got {value!r}")


_path = check_path


def nodes_of(answers: Sequence[tuple[str, Any, str]]) -> tuple[list[Node], list[str]]:
    """Each host's checked facts, and a line for each host that gave none usable."""
    nodes: list[Node] = []
    problems = []
    for host, doc, error in answers:
        try:
            if doc is None:
                raise ValueError(error)
            node = _node(host, doc)
        except KeyError as err:
            problems.append(f"{host}: its `slurm conf --json` has no {err} (an older gpuwarden?)")
            continue
        except (ValueError, TypeError) as err:
            problems.append(f"{host}: {str(err) or type(err).__name__}")
            continue
        twin = next((n for n in nodes if n.name == node.name), None)
        if twin is not None:
            problems.append(f"{host}: calls itself {node.name}, as another node does")
            continue
        nodes.append(node)
    return nodes, problems


def _node(host: str, doc: Mapping[str, Any]) -> Node:
    """One reply made a Node, or ValueError saying what is wrong with it."""
    if not isinstance(doc, dict) or doc.get("schema") != 1:
        raise ValueError("did not answer with `slurm conf --json` (schema 1)")
    name = doc["node"]
    if not isinstance(name, str) or not _WORD.fullmatch(name):
        raise ValueError(f"its hostname {name!r} cannot be a Slurm node name")
    address = doc.get("address") or host.rpartition("@")[2]
    try:
        ipaddress.ip_address(address)
    except ValueError:
        if not _WORD.fullmatch(address):
            raise ValueError(f"no address for it ({address!r})") from None
    cpus, memory = doc["cpus"], doc.get("memory_mib")
    if not isinstance(cpus, int) or isinstance(cpus, bool) or not 0 < cpus < 1 << 20:
        raise ValueError(f"CPUs {cpus!r} is not a count")
    if memory is not None and (not isinstance(memory, int) or not 0 < memory < 1 << 40):
        raise ValueError(f"memory {memory!r} is not a size in MiB")
    gres, lines = doc["gres"], doc["gres_lines"]
    if not isinstance(gres, str) or not _GRES.fullmatch(gres):
        raise ValueError(f"Gres={gres!r} is not gres of GPUs")
    if not isinstance(lines, list) or not all(
        isinstance(x, str) and _GRES_LINE.fullmatch(x) for x in lines
    ):
        raise ValueError("its gres.conf lines are not gres.conf lines of GPUs")
    notes = doc.get("notes") or []
    python = doc.get("python")
    if not isinstance(python, str) or not _PATH.fullmatch(python):
        raise ValueError(f"its interpreter {python!r} is not an absolute path")
    from gpuwarden.files.safefiles import printable

    return Node(
        name=name,
        address=address,
        cpus=cpus,
        memory_mib=memory,
        gres=gres,
        gres_lines=tuple(lines),
        notes=tuple(printable(str(n))[:300] for n in notes if isinstance(notes, list)),
        python=python,
        source=printable(str(doc.get("source")))[:60],
    )


# --- the files -------------------------------------------------------------------------


def files(nodes: Sequence[Node], s: ClusterSettings, now: Optional[float] = None) -> dict[str, str]:
    """name -> contents of every file, for `write`."""
    from gpuwarden.slurm import clusterfiles as cf

    stamp = time.strftime("%Y-%m-%d %H:%M", time.gmtime(time.time() if now is None else now))
    head = f"# Written by `gpuwarden slurm cluster` on {stamp} UTC from each node's own facts."
    out = {
        "slurm.conf": cf.slurm_conf(nodes, s, head),
        "gres.conf": cf.gres_conf(nodes, head),
        "cgroup.conf": cf.cgroup_conf(s, head),
        "prolog.sh": hook("prolog", nodes, s),
        "epilog.sh": hook("epilog", nodes, s),
        "task-prolog.sh": hook("task-prolog", nodes, s),
        "README": cf.readme(nodes, s, head),
    }
    if s.slurmdbd:
        out["slurmdbd.conf"] = cf.slurmdbd_conf(s, head)
    return out


def hook(action: str, nodes: Sequence[Node], s: ClusterSettings) -> str:
    """The Prolog=/Epilog= program: each node's own gpuwarden, with the site's settings."""
    before, _, after = s.hook_env.partition("%n")
    env_file = shlex.quote(before) + ('"$SLURMD_NODENAME"' + shlex.quote(after) if _ else "")
    cases = "".join(f"  {n.name}) python={shlex.quote(n.python)} ;;\n" for n in nodes)
    said = {
        "prolog": "root (Prolog= in slurm.conf): `gpuwarden slurm prolog` leases the job's GPUs,\n"
        "# so Slurm jobs and local `gpuwarden run` users never share a GPU (docs/slurm.md).",
        "epilog": "root (Epilog= in slurm.conf): `gpuwarden slurm epilog` frees the job's GPU\n"
        "# leases, so the GPUs are the local users' and Slurm's again (docs/slurm.md).",
        "task-prolog": "the job's user in each task (TaskProlog= in slurm.conf): `gpuwarden slurm\n"
        "# task-prolog` prints CUDA_VISIBLE_DEVICES as the UUIDs of the MIG slices the job was\n"
        "# given, which CUDA needs (Slurm writes gres.conf positions; docs/slurm.md).",
    }[action]
    return (
        "#!/bin/sh\n"
        f"# slurmd runs this as {said}\n"
        "# Site settings for gpuwarden (GPUWARDEN_* variables: where leases and drains live),\n"
        "# if the file exists; slurmd gives hooks an environment of their own.\n"
        f"env_file={env_file}\n"
        'if [ -r "$env_file" ]; then set -a; . "$env_file"; set +a; fi\n'
        "# Each node's own gpuwarden, as its `slurm conf --json` named its interpreter.\n"
        'case "$SLURMD_NODENAME" in\n'
        f"{cases}"
        "  *) python=python3 ;;\n"
        "esac\n"
        f'exec "$python" -m gpuwarden slurm {action}\n'
    )


def write(folder: str, contents: Mapping[str, str]) -> None:
    """The files into a new (or empty) directory: an admin's earlier files are never
    overwritten. Hooks are executable, the rest readable by the daemons' user."""
    from gpuwarden.files.safefiles import write_atomic

    try:
        os.makedirs(folder, mode=0o755, exist_ok=True)
        left = os.listdir(folder)
    except OSError as err:
        raise UserError(f"cannot make {folder}: {err.strerror}") from None
    if left:
        raise UserError(f"{folder} is not empty ({sorted(left)[0]} ...); give a new directory")
    for name, text in contents.items():
        mode = 0o755 if name.endswith(".sh") else 0o644
        if name == "slurmdbd.conf":
            mode = 0o600  # it will hold the database password
        path = os.path.join(folder, name)
        write_atomic(path, text.encode(), mode=mode)
        os.chmod(path, mode)  # whatever the umask: slurmd runs the hooks
