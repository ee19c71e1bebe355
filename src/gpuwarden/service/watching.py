"""The enforcement watcher inside the queue service: the `[enforce]` policies applied to
the service's leases, unreserved use charged to fair share, every action counted and
told to the job's owner.

Where a service runs, it is the watcher (`gpuwarden enforce --watch` is for
machines without one): it already reads the GPUs and owns the leases, and only it
knows a lease's job, its owner and its output file. Every `enforce.poll_seconds`
on the loop's tick it

- runs `gpuwarden.monitoring.enforcer.Enforcer` over the GPUs and the leases (memory over
  its declaration, unleased use, idle leases) and carries out what it decides;
- counts each action by policy and kind, for the exporter (`stats`);
- for an action on a service job, appends the line to the job's output file,
  opened in the owner's name (a child that became the owner opens it: a symlink
  the owner planted can lead nowhere the owner could not write), and sends it
  to the owner through the service's notifier;
- charges each user's GPU-seconds of unreserved use (a GPU process that belongs
  to no lease) to their fair-share usage, one GPU per GPU used, for the time it
  was seen (at most two polls per reading, so a stalled service never
  overcharges), and keeps the current list for `queue`'s header and `stats`.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Optional

from gpuwarden.base.units import is_digits
from gpuwarden.service import store

if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Protocol

    from gpuwarden.machine.inventory import Gpu
    from gpuwarden.monitoring.enforcer import Action
    from gpuwarden.service.notify import JobNotifier
    from gpuwarden.service.settings import Settings
    from gpuwarden.usage.enforcement import Unleased

    class WatchedService(Protocol):
        """What the watch needs of the jobs' life (`joblife.JobLife` has it)."""

        settings: Settings
        store: store.Store
        notifier: JobNotifier
        read_snapshot: Callable[[], Any]


log = logging.getLogger("gpuwarden.serve")


def charges(found: Iterable[Unleased], seconds: float) -> dict[str, float]:
    """GPU-seconds of unreserved use per user for `seconds` of it: one GPU for every GPU a
    user has an unleased process on, however many processes (a process of no known user
    is charged to nobody)."""
    pairs = {(f.gpu, f.user) for f in found if f.user}
    out: dict[str, float] = {}
    for _, user in pairs:
        out[str(user)] = out.get(str(user), 0.0) + max(0.0, seconds)
    return out


def gpu_indices(gpus: Iterable[Gpu]) -> dict[str, int]:
    """nvidia-smi's index by UUID, of each GPU and of each MIG slice (its GPU's), so a
    process on a slice is shown on its GPU rather than on "GPU ?"."""
    out = {g.uuid: g.index for g in gpus}
    out.update((m.uuid, g.index) for g in gpus for m in g.mig_instances)
    return out


def unleased_rows(
    found: Sequence[Unleased], indices: Mapping[str, int], since: Mapping[tuple[str, int], float]
) -> list[dict[str, Any]]:
    """What `queue` and `stats` show of unreserved use: GPU, pid, user, whose GPU, since."""
    return [
        {
            "gpu": f.gpu,
            "index": indices.get(f.gpu),
            "pid": f.pid,
            "user": f.user,
            "leased_to": f.leased_to,
            "since": since.get((f.gpu, f.pid)),
        }
        for f in found
    ]


class ServiceWatch:
    def __init__(self, service: WatchedService) -> None:
        from gpuwarden.monitoring.enforcer import Enforcer

        self.service = service
        self.enforcer = Enforcer(service.settings.enforce)
        self.counts: dict[tuple[str, str], int] = {}  # (policy, kind) -> actions taken
        self.unleased: list[dict[str, Any]] = []
        self.last: Optional[float] = None

    def due(self, now: float) -> bool:
        return self.last is None or now - self.last >= self.service.settings.enforce_every

    def step(self, now: Optional[float] = None) -> None:
        from gpuwarden.leases import list_leases

        now = time.time() if now is None else now
        svc = self.service
        snapshot = svc.read_snapshot()
        leases = list_leases(svc.settings.lease_dir)
        actions = self.enforcer.step(snapshot, leases, now)
        self.enforcer.carry_out(actions, now, may_signal=os.geteuid() == 0)
        jobs = {x.pid: x.job for x in leases if x.job}
        running: Optional[dict[int, store.Job]] = None
        for act in actions:
            key = (act.policy, act.kind)
            self.counts[key] = self.counts.get(key, 0) + 1
            job = self._job_of(jobs.get(act.pid) if act.pid else None, act.pid)
            if job is None and act.pid:
                # A process on a GPU no lease of its own names (unleased use): the job
                # it belongs to, by ancestry, is told as over-use of --mem is.
                if running is None:
                    running = {j.pid: j for j in svc.store.jobs([store.RUNNING]) if j.pid}
                job = self._job_by_ancestry(act.pid, running)
            if job is not None:
                self._tell(job, act)
        found = self.enforcer.last_unleased
        since = {k: v.since for k, v in self.enforcer.unleased.items()}
        self.unleased = unleased_rows(found, gpu_indices(snapshot.gpus), since)
        if self.last is not None:
            seconds = min(now - self.last, 2 * svc.settings.enforce_every)
            half_life = svc.settings.policy.half_life
            for user, amount in charges(found, seconds).items():
                svc.store.charge(user, amount, now, half_life)
        self.last = now

    def _job_of(self, job_id: Optional[str], pid: Optional[int]) -> Optional[store.Job]:
        """The service job a lease names, only when the journal agrees on its pid (a lease
        record in the service's own directory, checked against the service's journal)."""
        if not job_id or not is_digits(job_id) or pid is None:
            return None
        job = self.service.store.get(int(job_id))
        if job is None or job.pid != pid or job.state != store.RUNNING:
            return None
        return job

    def _job_by_ancestry(self, pid: int, running: dict[int, store.Job]) -> Optional[store.Job]:
        from gpuwarden.machine.ancestry import lineage

        return next((running[p] for p in lineage(pid) if p in running), None)

    def _tell(self, job: store.Job, act: Action) -> None:
        line = f"gpuwarden: {act.policy} {act.kind}: {act.message}\n"
        if job.output and not job.attached:
            append_as(job, line)
        self.service.notifier.notify(
            {
                "event": "enforcement",
                "job": job.id,
                "user": job.user,
                "state": f"{act.policy} {act.kind}",
                "policy": act.policy,
                "action": act.kind,
                "error": act.message,
                "command": list(job.argv),
                "gpus": list(job.gpus),
                "output": job.output,
                "elapsed": time.time() - (job.started or time.time()),
                "host": os.uname().nodename,
            }
        )


def append_as(job: store.Job, line: str, timeout: float = 5.0) -> bool:
    """Append `line` to `job`'s output file as its owner: a child drops to the owner (as the
    job itself did) and opens the file, so the service never writes where the owner could
    not, whatever symlink stands there. False when it could not."""
    from gpuwarden.service.becoming import drop_privileges
    from gpuwarden.service.identity import person

    assert job.output is not None
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            drop_privileges(person(job.uid, job.gid))
            fd = os.open(job.output, os.O_WRONLY | os.O_APPEND | os.O_NOCTTY | os.O_NONBLOCK)
            try:
                os.write(fd, line.encode("utf-8", "replace"))
                code = 0
            finally:
                os.close(fd)
        except BaseException:  # a child: its exit status says it all
            code = 1
        finally:
            os._exit(code)
    deadline = time.monotonic() + timeout
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            ok = os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0
            if not ok:
                log.warning("job %s: could not append a warning to %s", job.id, job.output)
            return ok
        if time.monotonic() > deadline:  # a FIFO with no reader, a hung filesystem
            os.kill(pid, 9)
            os.waitpid(pid, 0)
            return False
        time.sleep(0.002)
