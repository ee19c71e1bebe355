"""From the machine and the journal to `scheduling.plan`'s inputs, and from a decision to
a running job holding its leases.

The plan sees every GPU (a MIG-mode GPU as its MIG slices, as `gpuwarden.placement.mig` gives
them; unusable when drained, fatal or lost), every job of the queue that holds GPUs,
every other holder of a lease in the service's directory (a Slurm job's prolog, say),
and every process on a GPU that nobody leased, as an occupant with the memory it
uses — so a colleague's plain `python train.py` is respected as it is without the
service. The plan decides who starts and how many GPUs; which GPUs a job may ever
get (`fitting`) and which of the free ones it gets (`pick`) is `gpuwarden.placement.selection`'s
choice, the one `run` makes: health, topology, MIG slices, sharing.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Optional

from gpuwarden.base.errors import UserError
from gpuwarden.planning import scheduling
from gpuwarden.service import arrays, spawn, starting, store
from gpuwarden.service.identity import person

if TYPE_CHECKING:
    from typing import Protocol

    from gpuwarden.config import Config
    from gpuwarden.leases.record import LeaseInfo
    from gpuwarden.machine.inventory import Gpu, Snapshot
    from gpuwarden.placement.request import Request
    from gpuwarden.service.attachment import Attachments
    from gpuwarden.service.forker import Forker
    from gpuwarden.service.machine import Machine
    from gpuwarden.service.pacing import Pacer
    from gpuwarden.service.settings import Settings
    from gpuwarden.service.starting import StartingService

    class PlacingService(Protocol):
        """What placing a job needs of the jobs' life (`joblife.JobLife` has it)."""

        settings: Settings
        store: store.Store
        exits: str
        pacer: Pacer
        hardware: Machine
        attachments: Attachments  # the attached jobs' clients (the socket loop's)
        forker: Forker  # forks the supervisors (service.forker)


def request_of(job: store.Job) -> Request:
    """The request a queued job made, as its record keeps it (placement.requestwire),
    for as many GPUs as the plan counts it (`store.Job.count`: a CPU job holds a place
    of one GPU's)."""
    from dataclasses import replace

    from gpuwarden.placement.requestwire import from_wire

    return replace(from_wire(job.request, others=True), count=job.count)


def picker(
    snapshot: Snapshot,
    pending: Sequence[store.Job],
    seen: Sequence[LeaseInfo],
    findings: Optional[Mapping[str, Sequence[Any]]],
    linked: Optional[Callable[[Snapshot], Snapshot]] = None,
) -> scheduling.Pick:
    """`scheduling.Pick` for this pass: which of the GPUs free for a job it gets, chosen
    by `selection.choose` as `run` chooses (`seen`: the leases held now). Its named and
    excluded GPUs are already outside the free ones (`fitting`). `linked` adds the links
    between GPUs to a snapshot (service.machine keeps them; None: read them here)."""
    from dataclasses import replace

    from gpuwarden.placement.selection import choose

    by_id = {str(j.id): j for j in pending}
    wanted: dict[str, Any] = {}  # made for the jobs the plan asks about, not every one
    links: list[Any] = []

    def pick(job: scheduling.Waiting, free: Sequence[str]) -> Optional[tuple[str, ...]]:
        request = wanted.get(job.id)
        if request is None:
            request = replace(request_of(by_id[job.id]), gpus=None, exclude=())
            wanted[job.id] = request
        machine = snapshot
        if request.gpu_count > 1:  # where topology matters: read once a pass, when it does
            if not links:
                links.append((linked or _with_topology)(snapshot))
            machine = links[0]
        choice = choose(machine, request, seen, allowed=free, health=findings)
        return tuple(g.uuid for g in choice.gpus) if choice.ok else None

    return pick


def _with_topology(snapshot: Snapshot) -> Snapshot:
    """`snapshot` with the NVLink and PCIe links between its GPUs (the service reads the
    machine without them: they cost n^2 NVML calls and matter to multi-GPU jobs only)."""
    from dataclasses import replace

    if len(snapshot.gpus) < 2 or snapshot.topology:
        return snapshot
    from gpuwarden.machine.inventory import read_snapshot

    links = read_snapshot(processes=False, topology=True, detail=False)
    return replace(snapshot, topology=links.topology, nvlinks=links.nvlinks)


def inputs(
    snapshot: Snapshot,
    running: Sequence[store.Job],
    pending: Sequence[store.Job],
    settings: Settings,
    reading: Optional[Config] = None,
    leaving: Collection[int] = (),
    linked: Optional[Callable[[Snapshot], Snapshot]] = None,
    machine: Optional[Machine] = None,
) -> tuple[
    list[scheduling.QueueGpu], list[scheduling.Running], list[scheduling.Waiting], scheduling.Pick
]:
    """The plan's GPUs, running jobs and other holders, waiting jobs, and the `pick`;
    drains, XID logs and health rules as the pass's `reading` of the configuration
    says (None: the configuration in force). `leaving`: ids of running jobs told to end;
    `linked` as `picker`'s; `machine` the service's, whose lease directory and health
    files are kept while unchanged (None: read here)."""
    from gpuwarden import leases
    from gpuwarden.files.locations import state_location
    from gpuwarden.health import drain
    from gpuwarden.health.xidlog import judged
    from gpuwarden.placement.mig import devices
    from gpuwarden.placement.selection import fitting, unusable

    if machine is None:
        drains = drain.list_drains(state_location(reading))
        findings = judged(snapshot.gpus, conf=reading)
    else:
        drains = machine.health.current(state_location(reading))[0]
        findings = machine.health.judged(snapshot.gpus, reading)
    parent = {m.uuid: g.uuid for g in snapshot.gpus if g.mig_mode for m in g.mig_instances}
    units = devices(snapshot)  # what a job is given: GPUs, and MIG slices for MIG-mode ones

    def usable(g: Gpu) -> bool:  # as `run` judges it: selection.unusable
        own = parent.get(g.uuid, g.uuid)
        return unusable(g.uuid, own, drains, findings.get(own, ())) is None

    gpus = [scheduling.QueueGpu(g.uuid, g.memory_total or 0, usable=usable(g)) for g in units]
    now = time.time()
    busy = [
        scheduling.Running(
            str(j.id),
            j.user,
            j.gpus,
            j.started or now,
            j.mem,
            j.time_limit,
            preemptible=j.preemptible,
            leaving=j.id in leaving,
            account=j.account,
        )
        for j in running
    ]
    ours = {str(j.id) for j in running}
    held: set[str] = set()
    seen = list(leases.list_leases(settings.lease_dir, machine.lease_dirs if machine else None))
    for lease in seen:
        held.add(lease.uuid)
        if lease.job in ours:
            continue
        limit = None if lease.expires is None else max(0.0, lease.expires - lease.started)
        busy.append(
            scheduling.Running(
                f"lease:{lease.uuid}:{lease.pid}",
                lease.user,
                (lease.uuid,),
                lease.started,
                lease.mem,
                limit,
            )
        )
    held.update(u for j in running for u in j.gpus)
    for gpu in units:
        if gpu.uuid in held or not gpu.processes:
            continue
        used = sum(p.used_memory or 0 for p in gpu.processes) or 1
        owner = next((p.user for p in gpu.processes if getattr(p, "user", None)), "?")
        busy.append(scheduling.Running(f"proc:{gpu.uuid}", owner or "?", (gpu.uuid,), now, used))
    waiting = []
    # A long queue is mostly jobs of a few shapes: each shape's GPUs are worked out once.
    shapes: dict[tuple[Optional[int], str], frozenset[str]] = {}
    for job in pending:
        shape = (job.mem, repr(job.request))  # cheap: a differently ordered twin only misses
        if shape not in shapes:
            try:
                shapes[shape] = fitting(snapshot, request_of(job), findings)
            except UserError:
                shapes[shape] = frozenset()  # its named GPUs are gone: it waits, reason Drained
        allowed = shapes[shape]
        waiting.append(
            scheduling.Waiting(
                str(job.id),
                job.user,
                job.count,
                job.submitted,
                mem=job.mem,
                time_limit=job.time_limit,
                nice=job.nice,
                qos=job.qos,
                held=job.held,
                after=tuple(str(a) for a in job.after),
                eligible=allowed,
                begin=job.begin,
                preemptible=job.preemptible,
                account=job.account,
            )
        )
    return gpus, busy, waiting, picker(snapshot, pending, seen, findings, linked)


def record_reasons(
    journal: store.Store,
    throttled: Sequence[store.Job],
    decisions: Sequence[scheduling.Decision],
    by_id: dict[int, store.Job],
) -> None:
    """Why each job the plan did not start waits, where that changed: one commit (none
    when nothing changed), not durable (the next pass would say it again)."""
    reasons: list[tuple[int, Optional[str]]] = [
        (j.id, arrays.THROTTLED) for j in throttled if j.reason != arrays.THROTTLED
    ]
    for decision in decisions:
        job = by_id[int(decision.id)]
        if not decision.starts and job.wait and job.reason != decision.reason:
            reasons.append((job.id, decision.reason))
    if reasons:
        with journal.transaction(durable=False):
            for job_id, reason in reasons:
                journal.update(job_id, durable=False, reason=reason)


def start_job(
    service: PlacingService,
    job: store.Job,
    uuids: Sequence[str],
    snapshot: Snapshot,
    reading: Optional[Config] = None,
) -> Optional[starting.Starting]:
    """Lease `uuids` for `job` in the service's directory, fork its supervisor (which
    holds the lease descriptors: the job never has them), record the job STARTING and
    publish its lease, and return: `go` gives the go-ahead once the record is durable,
    and the supervisor's report comes as an event of the loop (service.starting).
    None: the machine moved under the plan. `reading`: the pass's configuration
    (drains, health)."""
    from gpuwarden.cgroups.migcaps import denied_for
    from gpuwarden.jobs import allocation
    from gpuwarden.jobs.launch import job_env
    from gpuwarden.placement.request import Request

    ld = service.hardware.lease_dirs.open(service.settings.lease_dir)
    request = Request(count=len(uuids), gpus=tuple(uuids), mem=job.mem, keep_first_last=False)
    # What the chosen GPUs use now, read just before they are leased: the plan's
    # reading may be up to a tick old (service.machine).
    snapshot = service.hardware.chosen(uuids)
    hardware = service.hardware
    outcome = allocation.attempt(
        ld, request, snapshot, job=str(job.id), conf=reading, health=hardware.health,
        spares=hardware.spares,
    )  # fmt: skip
    if outcome.held is None:
        # The machine moved since the plan (a process appeared, kept in the reading the
        # next pass plans on): plan again once at once (service.pacing). A request of
        # `run --wait` in line before the service's is served first: the refresh
        # tries again.
        service.store.update(job.id, durable=False, reason=scheduling.RESOURCES)
        if outcome.ahead:
            service.pacer.touch()
        else:
            service.pacer.retry()
        return None
    held = outcome.held
    try:
        gpus = sorted(held.gpus, key=lambda g: g.index)
        owner = person(job.uid, job.gid)
        launch = spawn.JobStart(
            job=str(job.id),
            argv=job.argv,
            owner=owner,
            cwd=job.cwd,
            env=dict(job.env),
            status_dir=service.exits,
            umask=job.umask,
            output=job.output,
            stdio=_stdio(service, job.id),
            keep=tuple(held.fds),
            extra_env={
                **simulated_machine(),
                **job_env({}, gpus, job=str(job.id), mem=job.mem),
                **arrays.task_env(service.store, job),
                # Runs before this one (requeued, retried, preempted): Slurm's
                # SLURM_RESTART_COUNT, so a job knows to resume from its checkpoint.
                "GPUWARDEN_RESTART_COUNT": str(job.restarts),
            },
            minors=tuple(g.minor for g in gpus),
            present=service.hardware.present(snapshot.gpus),
            devices=service.settings.devices,
            caps=None if service.settings.devices == "off" else denied_for(gpus, snapshot.gpus),
        )

        held.on_behalf = job.user  # status and the exporter name the owner, not root
        # A job with --time says when its lease ends (SIGTERM then): `status` shows it,
        # and another service or tool reading the leases can plan around it.
        expires = None if job.time_limit is None else time.time() + job.time_limit
        # Lease records are readable by every user (status): they carry the owner and the
        # job, never its command line (`queue` shows that to its owner and the admins).
        # Prepared now: a full disk fails here, nothing started.
        held.prepare("", expires=expires)

        def record(supervisor: int, since: int) -> None:
            # Committed before the supervisor may run the job, and durable before its
            # go-ahead (`go`: one fsync for the starts of a pass): a service killed
            # earlier leaves it STARTING with a supervisor that exits without running
            # it (service.recovery queues it again), a power cut leaves it PENDING.
            service.store.update(
                job.id,
                durable=False,
                state=store.STARTING,
                gpus=tuple(g.uuid for g in gpus),
                started=time.time(),
                reason=None,
                supervisor=supervisor,
            )
            # Seen by every client before the job can run, naming its supervisor until
            # the job's pid comes (starting); then other clients may allocate.
            held.publish(supervisor)

        forked = spawn.begin(launch, on_forked=record, go=False, forker=service.forker.fork)
    except BaseException:
        held.release()
        raise
    return starting.Starting(
        job.id, forked, held, tuple(gpus), time.monotonic() + spawn.REPORT_WITHIN
    )


def go(service: StartingService, starts: Sequence[starting.Starting]) -> None:
    """The go-ahead for `starts` (one pass's), after one fsync makes their STARTING
    records durable: a pass that starts four jobs waits for one fsync, not four. A
    journal that cannot sync gives none: each supervisor exits without running its
    job, whose report (none) fails it, and the error goes on to the loop."""
    if not starts:
        return
    try:
        service.store.sync()
    except BaseException:
        for start in starts:
            spawn.go_ahead(start.forked, run=False)
            starting.begun(service, start)
        raise
    for start in starts:
        spawn.go_ahead(start.forked)
        starting.begun(service, start)


def simulated_machine() -> dict[str, str]:
    """The service's own GPUWARDEN_SIM and GPUWARDEN_SIM_STATE: a service run on a
    simulated machine (docs/operations.md) gives its jobs the same machine, whatever
    the submitter's environment said (the service controls every GPUWARDEN_ variable)."""
    import os

    # The two names, not a walk of the whole environment per start.
    found = ((k, os.environ.get(k)) for k in ("GPUWARDEN_SIM", "GPUWARDEN_SIM_STATE"))
    return {k: v for k, v in found if v is not None}


def _stdio(service: PlacingService, job_id: int) -> Optional[tuple[int, int, int]]:
    fds = service.attachments.stdio.get(job_id)
    return None if not fds else (fds[0], fds[1], fds[2])


def release_leases(service: PlacingService, job: store.Job) -> None:
    """Remove a finished job's lease records once the kernel has dropped its GPU locks.

    The record goes even if someone else holds a lock on the record itself: a user who
    kept it open could otherwise make a finished job's GPU look leased forever. What
    decides is the GPU's lock file, which only root may open here (0600)."""
    import fcntl
    import os

    from gpuwarden import leases

    try:
        ld = service.hardware.lease_dirs.open(service.settings.lease_dir)
    except UserError:
        return
    for uuid in job.gpus:
        try:
            fd = ld.open(uuid + leases.LOCK_SUFFIX, os.O_RDONLY)
        except (UserError, OSError):
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # free only if nobody holds it
        except BlockingIOError:
            continue  # a leftover process of the job (or a job sharing the GPU) holds it
        finally:
            os.close(fd)
        with contextlib.suppress(OSError):
            os.unlink(ld.join(f"{uuid}.{job.id}{leases.HOLDER_SUFFIX}"))
