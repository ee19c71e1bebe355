"""The machine as the service plans on it: read whole only as often as it can change
unseen, and at a job's start only the GPUs chosen for it.

Reading every GPU through NVML for every pass made each start pay for the whole
machine (tens of calls a GPU, and with a real driver the slowest ones). What a
decision needs is much less:

- which GPUs there are, their memory and MIG slices, lost ones: read whole once,
  then at most every `WHOLE_EVERY` seconds while passes plan, and at once after a
  start found a process the reading did not show (the reading was behind: the
  retry plans on the whole machine);
- processes on the GPUs: a pass finding the reading older than `within` seconds
  (the loop's tick) reads again only the GPUs that showed processes (4 calls a
  GPU), so a GPU freed outside the queue is seen within a tick; a GPU the queue's
  own job leaves loses that job's processes from the reading at its end
  (`freed`), read by nobody, so the next job starts on it at once;
- at a job's start, the GPUs chosen for it read again (`chosen`: memory, use and
  processes, 4 calls a GPU) just before their leases are taken: a process that
  appeared on one since (outside the queue, on a GPU that showed none) is seen
  there, the job waits, and the next pass plans with what was read;
- the links between GPUs (n^2 calls) once, when a multi-GPU job first needs them:
  they change with the hardware, not between two jobs.

NVML stays initialised from the first reading of chosen GPUs for up to
`WHOLE_EVERY` seconds (`_session`): a real driver's nvmlInit opens every device and
costs far more than the four calls that follow it, so a start initialises nothing,
and the readings made meanwhile (the whole machine's for the enforcement watch and
the sampler, processes' use) nest inside it (NVML counts its initialisations: an
inner pair only counts). The first whole reading after that initialises it afresh
(a GPU reset or a driver reload since is then seen, as a new process would see it).

Every call into NVML goes through `Counted`, so `calls` says what the service
asked of the driver (`stats`, and tests/test_service_counts.py per started job).
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any, Optional

if TYPE_CHECKING:
    from gpuwarden.machine.inventory import Gpu, Snapshot

WHOLE_EVERY = 60.0  # seconds: GPUs lost or back, MIG slices changed, at most this late
DEV = "/dev"
SETTLED = 2.0  # seconds: /dev changed this recently may change again unseen


class Counted:
    """An NVML module whose functions count their calls; everything else (its error
    classes, its constants, the simulator's markers) is the module's own."""

    def __init__(self, nvml: Any) -> None:
        self._nvml = nvml
        self.calls = 0
        self.inits = 0  # of them, nvmlInit*: a real driver's costliest

    def __getattr__(self, name: str) -> Any:
        found = getattr(self._nvml, name)
        if not name.startswith("nvml") or isinstance(found, type) or not callable(found):
            return found
        init = name.startswith("nvmlInit")

        def counted(*args: Any) -> Any:
            self.calls += 1
            self.inits += init
            return found(*args)

        setattr(self, name, counted)  # found once; later lookups skip __getattr__
        return counted


class Machine:
    """The service's reading of the GPUs, kept current by what each decision needs."""

    def __init__(
        self,
        nvml: Optional[Callable[[], Any]] = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._load = nvml  # None: inventory.load_nvml, on first use
        self._nvml: Optional[Counted] = None
        self._clock = clock
        self.snapshot: Optional[Snapshot] = None  # the last reading
        self.read_at = float("-inf")  # when it was read whole (clock)
        self.used_at = float("-inf")  # when its GPUs with processes were read again
        self._links: Optional[tuple[Any, Any]] = None  # (topology, nvlinks), once
        self._session = False  # NVML initialised by us (for `WHOLE_EVERY` at most)
        self._session_at = float("-inf")  # when (clock)
        self._dev_stamp: Optional[tuple[int, ...]] = None  # /dev as last listed (`present`)
        self._dev_nodes: frozenset[int] = frozenset()
        self.whole_reads = 0
        self.whole_calls = 0  # of `calls`, those of whole readings
        from gpuwarden.leases.dir import Checked

        self.lease_dirs = Checked()  # the GPUs' locks: checked again when a stat changes
        from gpuwarden.leases.spares import Spares

        self.spares = Spares()  # lease record files made ahead of the starts
        from gpuwarden.health.files import HealthFiles

        self.health = HealthFiles()  # drains and XIDs: read again when their files change

    def stats(self) -> dict[str, int]:
        return {
            "nvml_calls": self.calls,
            "whole_reads": self.whole_reads,
            "whole_read_calls": self.whole_calls,
            "nvml_inits": 0 if self._nvml is None else self._nvml.inits,
            "lease_dir_checks": self.lease_dirs.checks,
            "health_reads": self.health.reads,
        }

    @property
    def calls(self) -> int:
        """NVML calls made so far."""
        return 0 if self._nvml is None else self._nvml.calls

    def nvml(self) -> Any:
        if self._nvml is None:
            from gpuwarden.machine.inventory import load_nvml

            self._nvml = Counted((self._load or load_nvml)())
        return self._nvml

    def read(self, detail: bool = False) -> Snapshot:
        """The whole machine now. What jobs are planned on needs no `detail` (clocks,
        temperatures, power, energy: what the efficiency sampler reads)."""
        from gpuwarden.machine.inventory import read_snapshot

        try:
            nvml = self.nvml()
        except ImportError:
            nvml = None  # read_snapshot says why in an empty snapshot
        if self._clock() - self._session_at >= WHOLE_EVERY:
            self._end_session()
        before = self.calls
        snapshot = read_snapshot(nvml, detail=detail)
        self.snapshot, self.read_at = snapshot, self._clock()
        self.used_at = self.read_at
        self.whole_reads += 1
        self.whole_calls += self.calls - before
        return snapshot

    def process_use(self, uuids: Iterable[str], since: int) -> dict[str, Any]:
        """Each process's share of the work on the GPUs of `uuids` since `since`
        (processuse.read_process_use): the efficiency sampler's, for shared GPUs."""
        from gpuwarden.machine.processuse import read_process_use

        nvml = self.nvml()
        nvml.nvmlInit()
        try:
            return read_process_use(nvml, uuids, since)
        finally:
            with contextlib.suppress(nvml.NVMLError):
                nvml.nvmlShutdown()

    def memory_peaks(self, pids: Mapping[str, Iterable[int]]) -> dict[str, Any]:
        """The most GPU memory each of `pids` held on each GPU, where the driver's
        accounting mode is on (processuse.read_memory_peaks): for shared GPUs."""
        from gpuwarden.machine.processuse import read_memory_peaks

        nvml = self.nvml()
        nvml.nvmlInit()
        try:
            return read_memory_peaks(nvml, pids)
        finally:
            with contextlib.suppress(nvml.NVMLError):
                nvml.nvmlShutdown()

    def current(self, within: float) -> Snapshot:
        """The reading a pass plans on: whole when none was made, the last one was
        refused or is `WHOLE_EVERY` old (or a start found it behind: `chosen`); else
        with the GPUs that showed processes read again once it is `within` old."""
        now = self._clock()
        snapshot = self.snapshot
        if snapshot is None or now - self.read_at >= WHOLE_EVERY:
            return self.read()
        if now - self.used_at < within:
            return snapshot
        if snapshot.error:
            return self.read()
        self.used_at = now
        return self._again(g for g in snapshot.gpus if g.processes)

    def chosen(self, uuids: Iterable[str]) -> Snapshot:
        """The reading with the GPUs of `uuids` (a MIG slice: its GPU) read again: what
        they use now. Kept, so the next pass plans with it; a process on one that the
        reading did not show means it is behind: the next pass reads it whole."""
        snapshot = self.snapshot if self.snapshot is not None else self.read()
        before = {g.uuid: {p.pid for p in g.processes} for g in snapshot.gpus}
        fresh = self._again(_of(snapshot, set(uuids)))
        if any({p.pid for p in g.processes} - before.get(g.uuid, set()) for g in fresh.gpus):
            self.read_at = float("-inf")
        return fresh

    def freed(self, uuids: Iterable[str]) -> None:
        """A job of the queue left the GPUs of `uuids`: its processes are gone with it
        (its cgroup's were killed), so the reading shows none there, read by nobody.
        One that stays (another's, outside the queue) is seen by `chosen` before a
        lease is taken there, and by the tick's reading."""
        from gpuwarden.base.records import replace

        snapshot = self.snapshot
        if snapshot is None:
            return
        left = {g.uuid for g in _of(snapshot, set(uuids)) if g.processes}
        if left:
            gpus = tuple(replace(g, processes=()) if g.uuid in left else g for g in snapshot.gpus)
            self.snapshot = replace(snapshot, gpus=gpus)

    def _again(self, chosen: Iterable[Gpu]) -> Snapshot:
        """The reading with the GPUs `chosen` (of it) read again (`read_use`)."""
        from gpuwarden.base.records import replace
        from gpuwarden.machine.inventory import read_use

        snapshot = self.snapshot if self.snapshot is not None else self.read()
        again = tuple(g for g in chosen if not g.lost)
        if not again or snapshot.error:
            return snapshot
        nvml = self.nvml()
        if not self._session:  # refused: read_use's own nvmlInit raises it, as before
            with contextlib.suppress(nvml.NVMLError):
                nvml.nvmlInit()
                self._session, self._session_at = True, self._clock()
        fresh = {g.uuid: g for g in read_use(nvml, again, held=self._session)}
        gpus = tuple(fresh.get(g.uuid, g) for g in snapshot.gpus)
        self.snapshot = replace(snapshot, gpus=gpus, taken_at=time.time())
        return self.snapshot

    def linked(self, snapshot: Snapshot) -> Snapshot:
        """`snapshot` with the NVLink and PCIe links between its GPUs, read once."""
        from gpuwarden.base.records import replace

        if len(snapshot.gpus) < 2 or snapshot.topology:
            return snapshot
        if self._links is None:
            from gpuwarden.machine.inventory import read_snapshot

            links = read_snapshot(self.nvml(), processes=False, topology=True, detail=False)
            self._links = (links.topology, links.nvlinks)
        return replace(snapshot, topology=self._links[0], nvlinks=self._links[1])

    def present(self, gpus: Iterable[Gpu]) -> tuple[int, ...]:
        """`cgroups.devices.present_minors(gpus)`, sorted: the GPU nodes a job's device
        cgroup denies but its own. /dev is listed again only when its stat changed (a
        node added or removed changes it; what changed within `SETTLED` seconds is
        listed each time), not for every start."""
        from gpuwarden.cgroups.devices import GPU_MINORS, present_minors

        try:
            st = os.stat(DEV)
            stamp: Optional[tuple[int, ...]] = (st.st_ino, st.st_mtime_ns, st.st_ctime_ns)
        except OSError:
            stamp = None
        if stamp is None or stamp != self._dev_stamp:
            self._dev_nodes = frozenset(present_minors((), DEV))
            settled = time.time_ns() - int(SETTLED * 1e9)
            fresh = stamp is None or max(stamp[1:]) >= settled
            self._dev_stamp = None if fresh else stamp
        minors = set(self._dev_nodes)
        for gpu in gpus:
            minor: Optional[int] = getattr(gpu, "minor", None)
            if minor is not None:
                minors.add(minor)
        return tuple(sorted(m for m in minors if m in GPU_MINORS))

    def close(self) -> None:
        """NVML shut down and the lease directories' watch closed (the service stops)."""
        self._end_session()
        self.spares.clear()
        self.lease_dirs.close()

    def _end_session(self) -> None:
        if self._session and self._nvml is not None:
            self._session = False
            with contextlib.suppress(self._nvml.NVMLError):
                self._nvml.nvmlShutdown()

    def forget_links(self) -> None:
        """Read the links again when next needed (a reload: the hardware may differ)."""
        self._links = None


def _of(snapshot: Snapshot, uuids: set[str]) -> list[Gpu]:
    """The GPUs of `snapshot` named in `uuids`, or holding a MIG slice named there."""
    return [
        g for g in snapshot.gpus if g.uuid in uuids or any(m.uuid in uuids for m in g.mig_instances)
    ]
