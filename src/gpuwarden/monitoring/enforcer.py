"""The enforcement watcher: read the machine and the leases, apply the policies of
`gpuwarden.usage.enforcement`, carry out and log what they decide.

`Enforcer.step` turns one reading (a Snapshot, the leases, the time, each process's
ancestry) into `Action`s and keeps the state the policies carry between readings;
`carry_out` does them. Everything done is logged with `logging` (logger
"gpuwarden.enforce"), one line per action, naming the GPU, the process and its user.

Killing: SIGTERM first, to every process of the job (its cgroup, see
`gpuwarden.cgroups.devices`; without one, the process group the lease holder leads, see
`gpuwarden.jobs.launch`) or to the single unleased process; a process still alive
`KILL_AFTER` seconds later gets SIGKILL at the next reading. Only processes whose
owner (from /proc, the kernel) is the lease's owner are signalled for a lease: the
pid written in a lease file is never trusted alone. A container whose processes run
under the lease (gpuwarden.leases.attribution) is not in the job's process group: its runtime
stops it (`podman stop ID`: its stop signal, then SIGKILL after its grace).
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess

from gpuwarden.base.records import record
from gpuwarden.base.units import is_digits
from gpuwarden.leases.attribution import policy_leases, use_of
from gpuwarden.machine.ancestry import container_job, container_of, lineage
from gpuwarden.placement.mig import devices, label
from gpuwarden.usage import enforcement as policy

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Sequence
    from typing import Any, Optional

log = logging.getLogger("gpuwarden.enforce")
KILL_AFTER = 10.0  # seconds between SIGTERM and SIGKILL


@record
class Action:
    """One thing to do: `kind` is warn | notify | kill | report | release."""

    kind: str
    policy: str  # memory | unleased | idle
    gpu: str  # UUID
    index: Optional[int]
    pid: Optional[int]
    user: Optional[str]
    message: str
    group: bool = False  # signal the process group led by `pid` (a lease's job)


def _uid_of(pid: int) -> Optional[int]:
    try:
        return os.stat(f"/proc/{pid}").st_uid
    except OSError:
        return None


def _user_uid(user: Optional[str]) -> Optional[int]:
    if user is None:
        return None
    import pwd

    try:
        return pwd.getpwnam(user).pw_uid
    except KeyError:
        return int(user) if is_digits(user) else None


def _size(n: Optional[int]) -> str:
    return "n/a" if n is None else f"{n / 2**30:.1f}GiB"


class Enforcer:
    """The policies' state between readings, and the kills waiting for their SIGKILL."""

    def __init__(
        self,
        rules: policy.EnforceSettings,
        lineage_of: Callable[[int], tuple[int, ...]] = lineage,
        container_of: Callable[[int], Optional[str]] = container_job,
    ):
        self.rules = rules
        self.lineage_of = lineage_of
        self.container_of = container_of
        self.memory: dict[tuple[str, int], policy.Since] = {}
        self.unleased: dict[tuple[str, int], policy.Since] = {}
        self.idle: dict[tuple[str, int], policy.Idle] = {}
        self.terminated: dict[int, tuple[float, bool]] = {}  # pid -> (SIGTERM sent, group)
        self.last_unleased: list[policy.Unleased] = []  # the last reading's unreserved use
        # Containers under each lease (holder pid -> (runtime, id)), and `stop`s under way.
        self.lease_containers: dict[int, set[tuple[str, str]]] = {}
        self.stopping: list[subprocess.Popen[bytes]] = []

    def step(self, snapshot: Any, leases: Sequence[Any], now: float) -> list[Action]:
        """What the policies decide for this reading (`leases`: gpuwarden.leases.LeaseInfo)."""
        actions: list[Action] = []
        # What a lease holds: a GPU, or a MIG slice in place of its parent (placement.mig),
        # with the slice's own processes and memory.
        gpus = {g.uuid: g for g in devices(snapshot) if not g.lost}
        held = policy_leases(leases)
        uses = [
            use_of(g, p, self.lineage_of, self.container_of)
            for g in gpus.values()
            for p in g.processes
        ]
        self._see_containers(held, uses)
        actions += self._memory(gpus, held, uses, now)
        actions += self._unleased(gpus, held, uses, now)
        actions += self._idle(gpus, held, now)
        return actions

    def _see_containers(self, held: list[policy.Lease], uses: list[policy.Use]) -> None:
        """Which containers run under which lease (by its holder's pid): a container is
        not in its job's process group, so ending the job must also stop them."""
        self.lease_containers = {}
        for use in uses:
            lease = policy.lease_of(use, held) if use.container else None
            if lease is None or lease.pid is None:
                continue
            found = container_of(use.pid)
            if found is not None:
                self.lease_containers.setdefault(lease.pid, set()).add(found)

    def _memory(
        self, gpus: dict[str, Any], held: list[policy.Lease], uses: list[policy.Use], now: float
    ) -> list[Action]:
        out, seen = [], set()
        for lease in held:
            if lease.mem is None or lease.pid is None or lease.gpu not in gpus:
                continue
            key = (lease.gpu, lease.pid)
            seen.add(key)
            mine = [
                u.memory
                for u in uses
                if u.gpu == lease.gpu and policy.lease_of(u, [lease]) is lease
            ]
            used = (
                None
                if not mine or any(m is None for m in mine)
                else sum(m for m in mine if m is not None)
            )
            state, act = policy.memory_action(
                lease.mem, used, self.memory.get(key), now, self.rules
            )
            _keep(self.memory, key, state)
            if act is not None:
                limit = policy.memory_limit(lease.mem, self.rules.memory_tolerance)
                text = (
                    f"job {lease.job or lease.pid} of {lease.owner} uses {_size(used)} on "
                    f"{label(gpus[lease.gpu])}, over its --mem {_size(lease.mem)} "
                    f"(+{self.rules.memory_tolerance:g}% = {_size(limit)})"
                )
                if act == "warn":
                    text += f"; {self.rules.memory_action} after {self.rules.memory_grace:g}s"
                out.append(
                    Action(
                        act,
                        "memory",
                        lease.gpu,
                        gpus[lease.gpu].index,
                        lease.pid,
                        lease.owner,
                        text,
                        group=True,
                    )
                )
        _forget(self.memory, seen)
        return out

    def _unleased(
        self, gpus: dict[str, Any], held: list[policy.Lease], uses: list[policy.Use], now: float
    ) -> list[Action]:
        out, seen = [], set()
        self.last_unleased = policy.unleased(uses, held)
        for found in self.last_unleased:
            key = (found.gpu, found.pid)
            seen.add(key)
            state, act = policy.unleased_action(found, self.unleased.get(key), now, self.rules)
            _keep(self.unleased, key, state)
            if act is None:
                continue
            where = label(gpus[found.gpu])
            text = f"pid {found.pid} of {found.user or '?'} uses {where} without a lease"
            if found.container == "":
                text += " (in a GPU container started without gpuwarden)"
            elif found.container:
                text += f" (in a container of job {found.container}, whose lease is not on it)"
            if found.leased_to:
                text += f"; the GPU is leased to {found.leased_to}"
            out.append(
                Action(
                    act, "unleased", found.gpu, gpus[found.gpu].index, found.pid, found.user, text
                )
            )
        _forget(self.unleased, seen)
        return out

    def _idle(self, gpus: dict[str, Any], held: list[policy.Lease], now: float) -> list[Action]:
        out, seen = [], set()
        for lease in held:
            if lease.pid is None or lease.gpu not in gpus:
                continue
            gpu = gpus[lease.gpu]
            key = (lease.gpu, lease.pid)
            seen.add(key)
            state, act = policy.idle_action(
                gpu.utilization_gpu, gpu.memory_used, self.idle.get(key), now, self.rules
            )
            self.idle[key] = state
            if act is not None:
                text = (
                    f"lease of {lease.owner} (job {lease.job or lease.pid}) on {label(gpu)} "
                    f"idle for {self.rules.idle_after:g}s: 0% and no memory change"
                )
                out.append(Action(act, "idle", lease.gpu, gpu.index, lease.pid, lease.owner, text))
        _forget(self.idle, seen)
        return out

    # --- carrying out -------------------------------------------------------------------

    def carry_out(self, actions: Iterable[Action], now: float, may_signal: bool = True) -> None:
        """Log every action and send the signals (only `may_signal`: root, or a dry run)."""
        for act in actions:
            level = logging.WARNING if act.kind in ("warn", "notify", "report") else logging.ERROR
            log.log(level, "%s %s: %s", act.policy, act.kind, act.message)
            if act.kind not in ("kill", "release") or act.pid is None:
                continue
            if not may_signal:
                log.warning("%s %s: not root, pid %s left alone", act.policy, act.kind, act.pid)
                continue
            self._terminate(act, now)
        self._follow_up(now)

    def _terminate(self, act: Action, now: float) -> None:
        pid = act.pid
        assert pid is not None
        if act.policy != "unleased":  # a lease: its containers too, by their runtime
            for engine, cid in sorted(self.lease_containers.get(pid, ())):
                try:
                    self.stopping.append(
                        subprocess.Popen(
                            [engine, "stop", cid],
                            stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL,
                        )
                    )
                    log.info("%s %s: %s stop %s", act.policy, act.kind, engine, cid[:12])
                except OSError as err:
                    log.error("%s %s: cannot run %s stop: %s", act.policy, act.kind, engine, err)
        if act.policy != "unleased" and _uid_of(pid) != _user_uid(act.user):
            log.error(
                "%s %s: pid %s is not %s's process: not signalled",
                act.policy,
                act.kind,
                pid,
                act.user,
            )
            return
        try:
            _signal(pid, act.group, signal.SIGTERM)
        except ProcessLookupError:
            return
        except PermissionError as err:
            log.error("%s %s: cannot signal pid %s: %s", act.policy, act.kind, pid, err.strerror)
            return
        log.info("%s %s: SIGTERM sent to pid %s", act.policy, act.kind, pid)
        self.terminated[pid] = (now, act.group)

    def _follow_up(self, now: float) -> None:
        self.stopping = [p for p in self.stopping if p.poll() is None]
        for pid, (since, group) in list(self.terminated.items()):
            if now - since < KILL_AFTER:
                continue
            del self.terminated[pid]
            with contextlib.suppress(ProcessLookupError, PermissionError):
                _signal(pid, group, signal.SIGKILL)
                log.error("pid %s outlived SIGTERM by %gs: SIGKILL", pid, KILL_AFTER)


def _signal(pid: int, group: bool, signum: int) -> None:
    """`signum` to a job's whole tree (its cgroup when it has one: that catches what
    left the process group; else the group it leads), or to the one process."""
    if group:
        from gpuwarden.cgroups import accounting

        if accounting.signal_job(pid, signum):
            return
        if os.getpgid(pid) == pid:
            os.killpg(pid, signum)
            return
    os.kill(pid, signum)


def _keep(table: dict[Any, Any], key: Any, state: Any) -> None:
    if state is None:
        table.pop(key, None)
    else:
        table[key] = state


def _forget(table: dict[Any, Any], seen: set[Any]) -> None:
    """Drop the state of what is no longer there (the job ended, the process left)."""
    for key in [k for k in table if k not in seen]:
        del table[key]
