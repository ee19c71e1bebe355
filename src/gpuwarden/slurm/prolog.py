"""Leases for the GPUs Slurm gave a job, so local users and Slurm jobs never share one.

slurmd runs `gpuwarden slurm prolog` (as root, `Prolog=` with `PrologFlags=Alloc`)
when a job is allocated on this node, and `gpuwarden slurm epilog` when it ends.
The prolog takes gpuwarden leases on exactly the GPUs in SLURM_JOB_GPUS; a
lease must outlive the prolog process (a lease is a held flock, dropped when
its last holder exits), so a small holder process per job, in its own session
with no terminal, keeps the lock descriptors until the epilog stops it. If the
holder dies any other way, the kernel frees the GPUs as usual.

One queue on the node. The prolog holds the job (Slurm shows it RUNNING with reason
Prolog; nothing of it runs yet) while any of its GPUs is drained in gpuwarden, by hand
or by the health watch, and while a local `gpuwarden run --wait` that joined the line
before the job was allocated still waits for GPUs these could serve: its GPUs stay
allocated to it in Slurm, so Slurm places no other job there, and the rest keep
serving Slurm. Why it waits goes to the job's AdminComment (`gpuwarden queue --slurm`
shows it). Neither failing nor requeueing is used: a failed prolog drains the whole
node in Slurm, and a job requeued from its prolog may still be launched (docs/slurm.md).

A GPU a local job holds though nobody was waiting in line (it was leased outside the
line while Slurm assigned it) is waited for up to `slurm.prolog_timeout`; then the
prolog fails, and Slurm, as it does for any failed prolog, drains the node and requeues
the job: a conflict is reported, never silently shared.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Optional

from gpuwarden.base.errors import UserError
from gpuwarden.base.units import is_digits

JOB_PREFIX = "slurm-"
NOTE_PREFIX = "gpuwarden: "
POLL = 0.5


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


def blockers(
    gpus: Sequence[Any],
    drained: Mapping[str, Any],
    line: Sequence[Any],
    before: float,
    usable: int,
    parents: Mapping[str, str],
) -> list[str]:
    """Why the job may not take `gpus` yet (pure): each drained GPU, and each local
    waiter that joined the line before `before` (the job's allocation), could use one of
    them (no `allowed` list, or one naming them) and needs no more than the `usable`
    GPUs there are; `parents` maps a MIG device to its GPU, whose drain holds back
    every slice. Empty: the GPUs may be leased."""
    why = []
    for gpu in gpus:
        for uuid in (gpu.uuid, parents.get(gpu.uuid)):
            if uuid and uuid in drained:
                reason = getattr(drained[uuid], "reason", "") or "no reason given"
                why.append(f"GPU {gpu.index} is drained ({reason})")
                break
    ours = {g.uuid for g in gpus}
    for waiter in line:
        # when it joined: its ticket's name, which the kernel vouches for (the file's
        # change time), not the `since` its owner wrote inside
        joined = int(waiter.key[:20]) / 1e9 if waiter.key[:20].isdigit() else before
        if joined >= before or waiter.request is None:
            continue
        from gpuwarden.leases import needs

        if needs(waiter.request) > usable:
            continue  # can never be served: it must not hold Slurm for ever
        if waiter.allowed is None or ours & set(waiter.allowed):
            why.append(f"{waiter.user}'s `gpuwarden run --wait` is first in line")
            break
    return why


def _leased_by(ld: Any, gpus: Sequence[Any]) -> str:
    from gpuwarden import leases

    holders = {i.uuid: i for i in leases.list_leases(ld.path)}
    busy = [g for g in gpus if g.uuid in holders] or list(gpus)
    return ", ".join(
        f"GPU {g.index} ({holders[g.uuid].user} pid {holders[g.uuid].pid})"
        if g.uuid in holders
        else f"GPU {g.index}"
        for g in busy
    )


def _hold(
    ld: Any,
    job: str,
    gpus: Sequence[Any],
    timeout: float,
    *,
    waiting: Callable[[], list[str]],
    note: Callable[[str], None],
    gone: Callable[[], bool] = lambda: False,
) -> Any:
    """Take exclusive leases on exactly `gpus` (Slurm chose them: no selection) once
    `waiting()` has nothing to say, reporting each new reason through `note`. A local
    lease in the way is waited for without limit when the job yielded to the line
    first (the waiter it let go ahead now holds the GPU), else up to `timeout`. None
    when `gone()` says the job ended meanwhile (cancelled, out of time)."""
    from gpuwarden import leases

    yielded = False
    conflict_since: Optional[float] = None
    said = ""
    while True:
        why = waiting()
        if not why:
            held = leases.lease_exactly(ld, gpus, job, patience=leases.ALLOC_PATIENCE)
            if held is not None:
                if said:
                    note("")
                return held  # the allocation lock is kept until publish, as always
            who = _leased_by(ld, gpus)
            if not yielded:
                conflict_since = conflict_since or time.monotonic()
                if time.monotonic() - conflict_since >= timeout:
                    raise UserError(
                        f"Slurm job {job[len(JOB_PREFIX) :]}: still leased locally after "
                        f"{timeout:.0f} s: {who}"
                    )
            why = [f"waiting for the local lease on {who}"]
        else:
            yielded, conflict_since = True, None
        text = "; ".join(why)
        if text != said:
            note(text)
            said = text
        if gone():
            return None
        time.sleep(POLL)


def set_note(job: str, text: str) -> None:
    """Say in the job's AdminComment why its prolog waits (`""`: clear it). Only Slurm
    admins (the prolog runs as root) may set AdminComment, so a user's own Comment
    cannot pass for gpuwarden's word. A controller that does not answer costs the
    note, never the job."""
    from gpuwarden.slurm import tools

    value = NOTE_PREFIX + text if text else ""
    try:
        tools.call(["scontrol", "update", f"JobId={job}", f"AdminComment={value}"], timeout=10)
    except UserError as err:
        print(f"Slurm job {job}: could not note why it waits: {err}", flush=True)


def prolog(
    environ: Mapping[str, str],
    timeout: float,
    lease_dir: Optional[str] = None,
) -> str:
    """Lease the job's GPUs in a detached holder; a one-line summary."""
    from gpuwarden.files.locations import state_location
    from gpuwarden.health.drain import list_drains
    from gpuwarden.leases import dir as leasedir
    from gpuwarden.leases import waitline
    from gpuwarden.machine.inventory import read_snapshot

    before = time.time()
    job = job_id(environ)
    indices = job_gpus(environ)
    if not indices:
        return f"Slurm job {job}: no GPUs, nothing to lease"
    snapshot = read_snapshot(processes=False)
    units = slurm_devices(snapshot)
    parents = {u.uuid: g.uuid for g in snapshot.gpus for u in units if u.index == g.index}
    missing = [i for i in indices if i >= len(units)]
    if missing:
        raise UserError(
            f"Slurm job {job}: GPU {','.join(map(str, missing))} of SLURM_JOB_GPUS is not on "
            f"this machine ({len(units)} GPUs); is gres.conf `gpuwarden slurm conf`'s?"
        )
    gpus = [units[i] for i in indices]
    ld = leasedir.open_dir(lease_dir)
    where = state_location()

    def waiting() -> list[str]:
        drained = list_drains(where)
        usable = sum(1 for u in units if u.uuid not in drained and parents[u.uuid] not in drained)
        return blockers(gpus, drained, waitline.read_line(ld), before, usable, parents)

    def noted(text: str) -> None:
        if text:
            print(f"Slurm job {job}: waits: {text}", flush=True)
        set_note(job, text)

    held = _hold(ld, JOB_PREFIX + job, gpus, timeout, waiting=waiting, note=noted, gone=ended(job))
    if held is None:
        return f"Slurm job {job}: ended while its prolog waited; nothing leased"
    from gpuwarden.jobs.holder import hold_in_background

    pid = hold_in_background(held, f"slurm job {job}", expires=None, seconds=None)
    names = ",".join(_name(g) for g in gpus)
    return f"Slurm job {job}: leased GPU {names} (holder pid {pid})"


def ended(job: str, every: float = 5.0) -> Callable[[], bool]:
    """Whether Slurm has ended the job (cancelled, out of time, requeued) while its
    prolog waits, asked at most every `every` seconds; a controller that does not
    answer counts as the job still there."""
    asked = [time.monotonic()]

    def check() -> bool:
        if time.monotonic() - asked[0] < every:
            return False
        asked[0] = time.monotonic()
        from gpuwarden.slurm import tools

        try:
            found = tools.queue(jobs=[job])
        except UserError:
            return False
        return not any(j.state in ("starting", "running") for j in found)

    return check


def slurm_devices(snapshot: Any) -> list[Any]:
    """What gres.conf lists, in its order (`gpuwarden slurm conf`): each GPU in NVML
    index order, a GPU in MIG mode replaced by its MIG devices, so SLURM_JOB_GPUS's
    numbers are positions in this list."""
    from gpuwarden.placement import mig

    return list(mig.devices(snapshot))


def _name(gpu: Any) -> str:
    from gpuwarden.placement import mig

    return f"{gpu.index} ({gpu.uuid})" if mig.is_mig(gpu) else str(gpu.index)


def epilog(environ: Mapping[str, str], lease_dir: Optional[str] = None) -> str:
    """Stop the job's holder and wait until its leases are gone.

    The pid in a lease record is only a claim (in the shared lease directory anyone may
    write a record named like this job's), so only records owned by whoever runs the
    epilog (root, as the prolog) count, and their holder is signalled only once the
    kernel proves it holds the record open (`gpuwarden.leases.holders.prove`)."""
    from gpuwarden import leases
    from gpuwarden.files.paths import user_name
    from gpuwarden.leases import holders

    job = job_id(environ)
    name = JOB_PREFIX + job
    if lease_dir is None:
        from gpuwarden.files.locations import lease_location

        lease_dir = lease_location()
    me = user_name(os.geteuid())
    held = [i for i in leases.list_leases(lease_dir) if i.job == name and i.user == me]
    if not held:
        return f"Slurm job {job}: no leases held"
    targets = {}
    for info in held:
        if info.pid not in targets:
            targets[info.pid] = holders.prove_holder(lease_dir, info, f"Slurm job {job}")
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
