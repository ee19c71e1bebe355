"""Leases for the GPUs Slurm gave a job, so local users and Slurm jobs never share one.

slurmd runs `gpuwarden slurm prolog` (as root, `Prolog=` with `PrologFlags=Alloc`)
when a job is allocated on this node, and `gpuwarden slurm epilog` when it ends.
The prolog takes gpuwarden leases on exactly the GPUs in SLURM_JOB_GPUS; a
lease must outlive the prolog process (a lease is a held flock, dropped when
its last holder exits), so a small holder process per job, in its own session
with no terminal, keeps the lock descriptors until the epilog stops it. If the
holder dies any other way, the kernel frees the GPUs as usual.

A GPU a local `gpuwarden run` holds when Slurm assigns it is waited for, up to
`slurm.prolog_timeout`; then the prolog fails, and Slurm, as it does for any
failed prolog, drains the node and requeues the job: a conflict is reported,
never silently shared.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Mapping, Sequence
from typing import Any, Optional

from gpuwarden.errors import UserError
from gpuwarden.units import is_digits

JOB_PREFIX = "slurm-"


def job_gpus(environ: Mapping[str, str]) -> list[int]:
    """SLURM_JOB_GPUS (`0,2` or `0-3`): positions in gres.conf, NVML indices when
    gres.conf is `gpuwarden slurm conf`'s."""
    text = environ.get("SLURM_JOB_GPUS", "").strip()
    if not text:
        return []
    out: list[int] = []
    for part in text.split(","):
        a, _, b = part.strip().partition("-")
        if not is_digits(a) or (b and not is_digits(b)):
            raise UserError(f"SLURM_JOB_GPUS={text!r}: cannot read {part!r}")
        out += range(int(a), int(b or a) + 1)
    return out


def job_id(environ: Mapping[str, str]) -> str:
    job = environ.get("SLURM_JOB_ID", "").strip()
    if not is_digits(job):
        raise UserError(f"SLURM_JOB_ID={job!r}: not a Slurm job id (run by slurmd as Prolog=)")
    return job


def _hold(ld: Any, job: str, gpus: Sequence[Any], timeout: float) -> Any:
    """Take exclusive leases on exactly `gpus` (Slurm chose them: no selection), waiting
    up to `timeout` seconds for any a local job still holds."""
    from gpuwarden import leases

    deadline = time.monotonic() + timeout
    while True:
        left = max(0.0, deadline - time.monotonic())
        held = leases.lease_exactly(ld, gpus, job, patience=max(left, leases.ALLOC_PATIENCE))
        if held is not None:
            return held  # the allocation lock is kept until publish, as always
        if time.monotonic() >= deadline:
            holders = {i.uuid: i for i in leases.list_leases(ld.path)}
            busy = [g for g in gpus if g.uuid in holders] or list(gpus)
            who = ", ".join(
                f"GPU {g.index} ({holders[g.uuid].user} pid {holders[g.uuid].pid})"
                if g.uuid in holders
                else f"GPU {g.index}"
                for g in busy
            )
            raise UserError(f"Slurm job {job}: still leased locally after {timeout:.0f} s: {who}")
        time.sleep(0.2)


def prolog(environ: Mapping[str, str], timeout: float, lease_dir: Optional[str] = None) -> str:
    """Lease the job's GPUs in a detached holder; a one-line summary."""
    from gpuwarden import leasedir
    from gpuwarden.inventory import read_snapshot

    job = job_id(environ)
    indices = job_gpus(environ)
    if not indices:
        return f"Slurm job {job}: no GPUs, nothing to lease"
    snapshot = read_snapshot(processes=False)
    by_index = {g.index: g for g in snapshot.gpus}
    missing = [i for i in indices if i not in by_index]
    if missing:
        raise UserError(
            f"Slurm job {job}: GPU {','.join(map(str, missing))} of SLURM_JOB_GPUS is not on "
            f"this machine ({len(snapshot.gpus)} GPUs); is gres.conf `gpuwarden slurm conf`'s?"
        )
    gpus = [by_index[i] for i in indices]
    ld = leasedir.open_dir(lease_dir)
    held = _hold(ld, JOB_PREFIX + job, gpus, timeout)
    from gpuwarden.jobs import hold_in_background

    pid = hold_in_background(held, f"slurm job {job}", expires=None, seconds=None)
    return f"Slurm job {job}: leased GPU {','.join(map(str, indices))} (holder pid {pid})"


def epilog(environ: Mapping[str, str], lease_dir: Optional[str] = None) -> str:
    """Stop the job's holder and wait until its leases are gone.

    The pid in a lease record is only a claim (in the shared lease directory anyone may
    write a record named like this job's), so only records owned by whoever runs the
    epilog (root, as the prolog) count, and their holder is signalled only once the
    kernel proves it holds the record open (`gpuwarden.holders.prove`)."""
    from gpuwarden import leases
    from gpuwarden.paths import user_name

    job = job_id(environ)
    name = JOB_PREFIX + job
    if lease_dir is None:
        from gpuwarden.locations import lease_location

        lease_dir = lease_location()
    me = user_name(os.geteuid())
    held = [i for i in leases.list_leases(lease_dir) if i.job == name and i.user == me]
    if not held:
        return f"Slurm job {job}: no leases held"
    targets = {}
    for info in held:
        if info.pid not in targets:
            targets[info.pid] = _prove(lease_dir, info, job)
    for target in targets.values():
        try:
            target.send(signal.SIGTERM)
        finally:
            target.close()
    deadline = time.monotonic() + 10
    while any(i.job == name and i.user == me for i in leases.list_leases(lease_dir)):
        if time.monotonic() > deadline:
            raise UserError(f"Slurm job {job}: lease holder pid {min(targets)} did not stop")
        time.sleep(0.02)
    indices = sorted(i.index for i in held if i.index is not None)
    return f"Slurm job {job}: released GPU {','.join(map(str, indices))}"


def _prove(lease_dir: str, info: Any, job: str) -> Any:
    from gpuwarden import holders, leases
    from gpuwarden.safefiles import open_regular

    path = os.path.join(lease_dir, f"{info.uuid}.{info.job}{leases.HOLDER_SUFFIX}")
    try:
        fd, st = open_regular(path, what="lease record")
    except (OSError, UserError) as err:
        raise UserError(f"Slurm job {job}: cannot open its lease record: {err}") from None
    os.close(fd)
    target, why = holders.prove(info.pid, st)
    if target is None:
        raise UserError(f"Slurm job {job}: not signalling pid {info.pid}: {why}")
    return target
