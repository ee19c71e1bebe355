"""The machine as the service plans on it: read whole only as often as it can change
unseen, and at a job's start only the GPUs chosen for it.

Reading every GPU through NVML for every pass made each start pay for the whole
machine (tens of calls a GPU, and with a real driver the slowest ones). What a
decision needs is much less:

- which GPUs there are, their memory and MIG slices, lost ones, and processes
  nobody leased: read whole (`current`) when a pass finds the last reading older
  than `within` seconds (the loop's tick), so a process started outside the
  queue is seen within a tick, as it was before;
- at a job's start, the GPUs chosen for it read again (`chosen`: memory, use and
  processes, 4 calls a GPU) just before their leases are taken: a process that
  appeared on one since is seen there, the job waits, and the next pass plans
  with what was read;
- the links between GPUs (n^2 calls) once, when a multi-GPU job first needs them:
  they change with the hardware, not between two jobs.

Every call into NVML goes through `Counted`, so `calls` says what the service
asked of the driver (`stats`, and tests/test_service_counts.py per started job).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any, Optional

if TYPE_CHECKING:
    from gpuwarden.machine.inventory import Snapshot


class Counted:
    """An NVML module whose functions count their calls; everything else (its error
    classes, its constants, the simulator's markers) is the module's own."""

    def __init__(self, nvml: Any) -> None:
        self._nvml = nvml
        self.calls = 0

    def __getattr__(self, name: str) -> Any:
        found = getattr(self._nvml, name)
        if not name.startswith("nvml") or isinstance(found, type) or not callable(found):
            return found

        def counted(*args: Any) -> Any:
            self.calls += 1
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
        self._links: Optional[tuple[Any, Any]] = None  # (topology, nvlinks), once
        self.whole_reads = 0
        self.whole_calls = 0  # of `calls`, those of whole readings

    def stats(self) -> dict[str, int]:
        return {
            "nvml_calls": self.calls,
            "whole_reads": self.whole_reads,
            "whole_read_calls": self.whole_calls,
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
        before = self.calls
        snapshot = read_snapshot(nvml, detail=detail)
        self.snapshot, self.read_at = snapshot, self._clock()
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
        """The reading, read whole again if it is older than `within` seconds."""
        if self.snapshot is None or self._clock() - self.read_at >= within:
            return self.read()
        return self.snapshot

    def chosen(self, uuids: Iterable[str]) -> Snapshot:
        """The reading with the GPUs of `uuids` (a MIG slice: its GPU) read again: what
        they use now. Kept, so the next pass plans with it."""
        from gpuwarden.base.records import replace
        from gpuwarden.machine.inventory import read_use

        snapshot = self.snapshot if self.snapshot is not None else self.read()
        wanted = set(uuids)
        again = [
            g
            for g in snapshot.gpus
            if not g.lost and (g.uuid in wanted or any(m.uuid in wanted for m in g.mig_instances))
        ]
        if not again or snapshot.error:
            return snapshot
        fresh = {g.uuid: g for g in read_use(self.nvml(), tuple(again))}
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

    def forget_links(self) -> None:
        """Read the links again when next needed (a reload: the hardware may differ)."""
        self._links = None
