"""What the fake library says about processes beyond the running-process lists.

Their names and each one's own share of the load (NVML's per-process utilisation
samples): monitors (nvitop, gpustat) and gpuwarden's efficiency sampler ask for these
about the processes they list; `gpuwarden run` never does, so `library.FakeLibrary`
loads this module when one of its functions is first looked up. A simulated
process has no /proc entry: its name comes from the command its spec or
`Machine.add_process` gave it; a real one is read from /proc.
"""

from __future__ import annotations

import time

from gpuwarden.sim.abi import INSUFFICIENT_SIZE, NOT_FOUND, SUCCESS, obj, val
from gpuwarden.sim.state import live_processes, utilization

TYPE_CHECKING = False  # typing stays off the start-up path; annotations need it only here
if TYPE_CHECKING:
    from typing import Any

    from gpuwarden.sim.state import StateFile


class ProcessInfo:
    """NVML's process name and utilisation functions, as methods of `FakeLibrary`."""

    file: StateFile

    def nvmlSystemGetProcessName(self, pid: Any, buf: Any, size: Any) -> int:
        pid = val(pid)
        for p in live_processes(self.file.read()):
            if p["pid"] == pid and p.get("command"):
                buf.value = p["command"].split()[0].encode()[: val(size) - 1]
                return SUCCESS
        try:
            with open(f"/proc/{pid}/comm", "rb") as handle:
                buf.value = handle.read().strip()[: val(size) - 1]
        except OSError:
            return NOT_FOUND
        return SUCCESS

    def nvmlDeviceGetProcessUtilization(
        self, state: Any, gpu: Any, mig: Any, array: Any, count_ref: Any, since: Any
    ) -> int:
        procs = [p for p in live_processes(state) if p["gpu"] == gpu["uuid"]]
        count = obj(count_ref)
        if not procs:
            return NOT_FOUND  # no samples since `since`, as the driver says for an idle GPU
        if array is None or count.value < len(procs):
            count.value = len(procs)
            return INSUFFICIENT_SIZE
        # Each added process (`sim occupy --util`, `Machine.add_process`) brings its own
        # load; the spec's own figure is split among the spec's processes. Together they
        # are the GPU's, as the driver's samples add up to its utilisation.
        listed = [p for p in procs if p.get("synthetic")]
        spare = max(0, utilization(state, gpu) - sum(p.get("util", 0) for p in procs))
        mem_share = gpu["memory_utilization"] // len(procs)
        now = int(time.time() * 1e6)
        for i, p in enumerate(procs):
            own = spare // len(listed) if p.get("synthetic") else p.get("util", 0)
            entry = array[i]
            entry.pid, entry.timeStamp = p["pid"], now
            entry.smUtil, entry.memUtil, entry.encUtil, entry.decUtil = own, mem_share, 0, 0
        count.value = len(procs)
        return SUCCESS
