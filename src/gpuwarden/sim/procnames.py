"""The fake library's answer to "what is process N called".

Monitors (nvitop, gpustat) ask it for the processes they list; `gpuwarden run`
never does, so `library.FakeLibrary` loads this module when the function is
first looked up. A simulated process has no /proc entry: its name comes from the
command its spec or `Machine.add_process` gave it; a real one is read from /proc.
"""

from __future__ import annotations

from gpuwarden.sim.ctypesio import NOT_FOUND, SUCCESS, val
from gpuwarden.sim.state import live_processes

TYPE_CHECKING = False  # typing stays off the start-up path; annotations need it only here
if TYPE_CHECKING:
    from typing import Any

    from gpuwarden.sim.state import StateFile


class ProcessNames:
    """NVML's process-name function, as a method of `FakeLibrary`."""

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
