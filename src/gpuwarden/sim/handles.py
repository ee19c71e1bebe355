"""The fake library's ways to a device other than by index.

A handle by UUID or PCI bus id, and between a MIG device's handle and its GPU's:
what other NVML clients (nvitop, gpustat, a user's script) use; gpuwarden itself
enumerates by index. So `library.FakeLibrary` loads this module when one of its
functions is first looked up.
"""

from __future__ import annotations

from gpuwarden.sim.abi import (
    INVALID_ARGUMENT,
    NOT_FOUND,
    SUCCESS,
    bus_key,
    handle,
    put,
    put_pointer,
    text,
)

TYPE_CHECKING = False  # typing stays off the start-up path; annotations need it only here
if TYPE_CHECKING:
    from typing import Any

    from gpuwarden.sim.state import StateFile


class Handles:
    """NVML's handle look-ups, as methods of `FakeLibrary`."""

    file: StateFile

    def nvmlDeviceGetHandleByUUID(self, uuid: Any, out: Any) -> int:
        wanted = text(uuid)
        for gpu in self.file.read()["gpus"]:
            if gpu["uuid"] == wanted:
                put_pointer(out, handle(gpu))
                return SUCCESS
            for mig in gpu.get("mig_instances", []) if gpu.get("mig") else []:
                if mig["uuid"] == wanted:
                    put_pointer(out, handle(gpu, mig))
                    return SUCCESS
        return NOT_FOUND

    def nvmlDeviceGetHandleByPciBusId_v2(self, bus: Any, out: Any) -> int:
        try:
            key = bus_key(text(bus))
        except ValueError:
            return INVALID_ARGUMENT
        for gpu in self.file.read()["gpus"]:
            if bus_key(gpu["pci_bus_id"]) == key:
                put_pointer(out, handle(gpu))
                return SUCCESS
        return NOT_FOUND

    def nvmlDeviceGetDeviceHandleFromMigDeviceHandle(
        self, state: Any, gpu: Any, mig: Any, out: Any
    ) -> int:
        if mig is None:
            return INVALID_ARGUMENT
        put_pointer(out, handle(gpu))
        return SUCCESS

    def nvmlDeviceIsMigDeviceHandle(self, state: Any, gpu: Any, mig: Any, out: Any) -> None:
        put(out, 0 if mig is None else 1)
