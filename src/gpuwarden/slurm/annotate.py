"""What this node's gpuwarden knows about Slurm's jobs, for `gpuwarden queue --slurm`.

Slurm shows a job whose prolog waits as RUNNING with reason Prolog, and knows nothing
of gpuwarden's drains. Two things are added where they are known: why the prolog
waits (the job's AdminComment, which only a Slurm admin, here the prolog, can set),
and which running jobs hold a GPU that was drained after they were placed on it
(their prolog's leases, owned by the user the prolog ran as, root, on a drained
GPU). On a login node without this machine's leases the second is simply absent.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from gpuwarden.base.errors import UserError
from gpuwarden.slurm.prolog import JOB_PREFIX, NOTE_PREFIX

#: At most this many starting jobs are asked for their note (one scontrol call each).
MOST_ASKED = 20


def prolog_notes(jobs: Sequence[Any]) -> dict[str, str]:
    """Job id -> why its prolog waits, for jobs still starting."""
    from gpuwarden.slurm import tools

    out: dict[str, str] = {}
    for job in [j for j in jobs if j.state == "starting"][:MOST_ASKED]:
        try:
            comment = tools.show_job(job.id).get("AdminComment", "").strip()
        except UserError:
            continue
        if comment.startswith(NOTE_PREFIX):
            out[job.id] = comment[len(NOTE_PREFIX) :]
    return out


def on_drained(leases: Sequence[Any], drained: Any, root: str) -> dict[str, list[int]]:
    """Job id -> the drained GPUs (indices) its prolog's leases hold (pure). Only
    leases owned by `root` count: anyone may name a lease `slurm-<id>`."""
    out: dict[str, list[int]] = {}
    for info in leases:
        job = info.job or ""
        if info.user != root or not job.startswith(JOB_PREFIX) or info.uuid not in drained:
            continue
        out.setdefault(job[len(JOB_PREFIX) :], []).append(info.index)
    return out


def local_drained() -> dict[str, list[int]]:
    """on_drained() for this machine; empty where its leases or drains cannot be read."""
    from gpuwarden import leases
    from gpuwarden.files.paths import user_name
    from gpuwarden.health.drain import list_drains

    try:
        drained = list_drains()
        if not drained:
            return {}
        return on_drained(leases.list_leases(), drained, user_name(0))
    except (OSError, UserError):
        return {}


def details(jobs: Sequence[Any]) -> dict[str, str]:
    """Job id -> what to add to its state in `queue --slurm`."""
    out = {k: f"Prolog: {v}" for k, v in prolog_notes(jobs).items()}
    running = {j.id for j in jobs if j.state == "running"}
    for job, indices in local_drained().items():
        if job in running:
            gpus = ",".join("?" if i is None else str(i) for i in sorted(indices, key=str))
            out[job] = f"on drained GPU {gpus}"
    return out
