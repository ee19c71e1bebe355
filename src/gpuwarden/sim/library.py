"""The fake `libnvidia-ml.so.1`: NVML's C functions, answered from the machine's state.

nvidia-ml-py's wrappers call C functions through `_nvmlGetFunctionPointer(name)`,
passing ctypes objects (`byref(c_uint())`, string buffers, struct arrays) and
checking an integer return code. This module provides those functions with the
same names, arguments and return codes, so the real wrappers, their struct
versions and their error classes all run unchanged on top of it; so does any
client (gpustat, nvitop) that calls function pointers itself. A symbol not here
raises NVMLError_FunctionNotFound from the real lookup code, as it does with an
older driver, and clients fall back as they would there.

Here are the functions reading a snapshot calls, so on the way of every simulated
`gpuwarden run`; the rest (sensors, links, events, handles, procinfo, and what
only other NVML tools ask: board, pcie, clocks, ecc, fields, gpm) are loaded when
first looked up (`FakeLibrary.__getattr__`, table `abi.ELSEWHERE`).

Per call: not initialised -> NVML_ERROR_UNINITIALIZED; a feature the card lacks
-> NVML_ERROR_NOT_SUPPORTED; a lost GPU -> NVML_ERROR_GPU_IS_LOST on everything
except its identity (UUID, PCI info, name, serial, index), which the driver
keeps from when the GPU was attached.
"""

from __future__ import annotations

from gpuwarden.sim import cards
from gpuwarden.sim.abi import (
    ALIASES,
    ARGUMENT_VERSION_MISMATCH,
    DEVICE_FIRST,
    ELSEWHERE,
    GPU_IS_LOST,
    IDENTITY,
    INSUFFICIENT_SIZE,
    INVALID_ARGUMENT,
    MIG_OK,
    MIXINS,
    NO_HANDLE,
    NO_INSTANCE,
    NOT_FOUND,
    NOT_SUPPORTED,
    SUCCESS,
    UNINITIALIZED,
    Fn,
    bus_key,
    handle,
    lacks,
    obj,
    put,
    put_pointer,
    resolve,
    val,
)
from gpuwarden.sim.specdata import THROTTLE_BITS
from gpuwarden.sim.state import StateFile, live_processes, memory_used, utilization

TYPE_CHECKING = False  # typing stays off the start-up path; annotations need it only here
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any, Optional

    from gpuwarden.sim.specdata import Spec


class FakeLibrary:
    """What `CDLL("libnvidia-ml.so.1")` would be, for one simulated machine."""

    def __init__(self, spec: Spec, nv: Any, state_dir: Optional[str] = None) -> None:
        self.spec = spec
        self.nv = nv  # the pynvml copy on top, for its struct types
        self.file = StateFile(spec, state_dir)
        self.refs = 0
        self.event_sets: dict[int, dict[str, Any]] = {}
        self.gpm_samples: dict[int, Optional[dict[str, Any]]] = {}
        for name in dir(type(self)):
            if name.startswith("nvml"):
                setattr(self, name, Fn(self._guarded(name, getattr(self, name)), name))
        for alias, target in ALIASES.items():
            if target in ELSEWHERE:
                continue  # set by __getattr__ when first looked up
            setattr(
                self,
                alias,
                Fn(self._guarded(alias, getattr(type(self), target).__get__(self)), alias),
            )

    def __getattr__(self, name: str) -> Any:
        """A function answered elsewhere, loaded when first looked up (called only for a
        name not set in `__init__`): choosing a GPU never needs the sensors, links, events
        or process names, so `gpuwarden run` never imports their code. Any other name
        raises AttributeError, which nvidia-ml-py turns into NVMLError_FunctionNotFound."""
        target = ALIASES.get(name, name)
        home = ELSEWHERE.get(target)
        if home is None:
            raise AttributeError(f"{type(self).__name__!r} has no symbol {name!r}")
        module = __import__(f"gpuwarden.sim.{home}", fromlist=[MIXINS[home]])
        method = getattr(getattr(module, MIXINS[home]), target).__get__(self)
        fn = Fn(self._guarded(name, method), name)
        setattr(self, name, fn)  # found directly from now on
        return fn

    # -- plumbing ---------------------------------------------------------------

    def _guarded(self, name: str, method: Callable[..., Any]) -> Callable[..., Any]:
        if name.startswith("nvmlInit") or name == "nvmlErrorString":
            return method
        device = (name.startswith("nvmlDevice") and name not in NO_HANDLE) or name in DEVICE_FIRST
        identity = name in IDENTITY
        mig_ok = name in MIG_OK
        two_devices = name == "nvmlDeviceGetTopologyCommonAncestor"

        def call(*args: Any) -> Any:
            if self.refs <= 0:
                return UNINITIALIZED
            if not device:
                return method(*args) or SUCCESS
            state = self.file.read()
            found = resolve(state, args[0])
            if found is None:
                return INVALID_ARGUMENT
            gpu, mig = found
            if gpu.get("lost") and not identity:
                return GPU_IS_LOST
            if mig is not None and not mig_ok:
                return NOT_SUPPORTED
            if two_devices:
                other = resolve(state, args[1])
                if other is None:
                    return INVALID_ARGUMENT
                return method(state, gpu, other[0], *args[2:]) or SUCCESS
            return method(state, gpu, mig, *args[1:]) or SUCCESS

        return call

    # -- library ----------------------------------------------------------------

    def nvmlInitWithFlags(self, flags: Any = 0) -> int:
        self.refs += 1
        return SUCCESS

    def nvmlInit_v2(self) -> int:
        return self.nvmlInitWithFlags(0)

    def nvmlShutdown(self) -> int:
        if self.refs <= 0:
            return UNINITIALIZED
        self.refs -= 1
        return SUCCESS

    def nvmlErrorString(self, result: Any) -> bytes:
        return self.nv.NVMLError._errcode_to_string.get(val(result), "Unknown Error").encode()

    # -- system -----------------------------------------------------------------

    def nvmlSystemGetDriverVersion(self, buf: Any, size: Any) -> None:
        buf.value = self.file.read()["driver_version"].encode()

    def nvmlSystemGetNVMLVersion(self, buf: Any, size: Any) -> None:
        state = self.file.read()
        buf.value = f"{state['cuda_version'] // 1000}.{state['driver_version']}".encode()

    def nvmlSystemGetCudaDriverVersion(self, out: Any) -> None:
        put(out, self.file.read()["cuda_version"])

    # -- enumeration ------------------------------------------------------------

    def nvmlDeviceGetCount_v2(self, out: Any) -> None:
        put(out, len(self.file.read()["gpus"]))

    def nvmlDeviceGetHandleByIndex_v2(self, index: Any, out: Any) -> int:
        gpus = self.file.read()["gpus"]
        i = val(index)
        if not 0 <= i < len(gpus):
            return INVALID_ARGUMENT
        put_pointer(out, handle(gpus[i]))
        return SUCCESS

    # -- identity ---------------------------------------------------------------

    def nvmlDeviceGetName(self, state: Any, gpu: Any, mig: Any, buf: Any, size: Any) -> None:
        name = gpu["name"] if mig is None else f"{gpu['name']} MIG {mig['profile']}"
        buf.value = name.encode()[: val(size) - 1]

    def nvmlDeviceGetUUID(self, state: Any, gpu: Any, mig: Any, buf: Any, size: Any) -> None:
        buf.value = (gpu if mig is None else mig)["uuid"].encode()

    def nvmlDeviceGetSerial(self, state: Any, gpu: Any, mig: Any, buf: Any, size: Any) -> int:
        if "GeForce" in gpu["name"]:
            return NOT_SUPPORTED
        buf.value = gpu["serial"].encode()
        return SUCCESS

    def nvmlDeviceGetIndex(self, state: Any, gpu: Any, mig: Any, out: Any) -> None:
        put(out, gpu["index"])

    def nvmlDeviceGetMinorNumber(self, state: Any, gpu: Any, mig: Any, out: Any) -> int:
        if mig is not None:  # a MIG device has no /dev/nvidiaN of its own
            return NOT_SUPPORTED
        put(out, gpu.get("minor", gpu["index"]))  # state files written before minors existed
        return SUCCESS

    def nvmlDeviceGetPciInfo_v3(self, state: Any, gpu: Any, mig: Any, ref: Any) -> None:
        info = obj(ref)
        domain, bus, device, _ = bus_key(gpu["pci_bus_id"])
        info.busIdLegacy = gpu["pci_bus_id"][4:].encode()
        info.busId = gpu["pci_bus_id"].encode()
        info.domain, info.bus, info.device = domain, bus, device
        info.pciDeviceId = gpu["pci_device_id"]
        info.pciSubSystemId = gpu["pci_subsystem_id"]

    def nvmlDeviceGetCudaComputeCapability(
        self, state: Any, gpu: Any, mig: Any, major: Any, minor: Any
    ) -> None:
        put(major, gpu["compute_capability"][0])
        put(minor, gpu["compute_capability"][1])

    # -- memory, load -------------------------------------------------------------

    def _memory(self, state: dict[str, Any], gpu: dict[str, Any], mig: Any) -> tuple[int, int, int]:
        """(total, reserved, used) as the v2 struct reports them."""
        if mig is not None:
            used = memory_used(state, gpu, mig["index"])
            return mig["memory_total"], 0, used + 13 * cards.MiB
        return gpu["memory_total"], gpu["memory_reserved"], memory_used(state, gpu)

    def nvmlDeviceGetMemoryInfo(self, state: Any, gpu: Any, mig: Any, ref: Any) -> None:
        total, reserved, used = self._memory(state, gpu, mig)
        out = obj(ref)
        out.total, out.used, out.free = total, used + reserved, total - used - reserved

    def nvmlDeviceGetMemoryInfo_v2(self, state: Any, gpu: Any, mig: Any, ref: Any) -> int:
        out = obj(ref)
        if out.version != self.nv.nvmlMemory_v2:
            return ARGUMENT_VERSION_MISMATCH
        total, reserved, used = self._memory(state, gpu, mig)
        out.total, out.reserved, out.used, out.free = total, reserved, used, total - used - reserved
        return SUCCESS

    def nvmlDeviceGetUtilizationRates(self, state: Any, gpu: Any, mig: Any, ref: Any) -> int:
        if gpu.get("mig"):
            return NOT_SUPPORTED  # per-instance load is only in DCGM
        out = obj(ref)
        out.gpu = utilization(state, gpu)
        out.memory = gpu["memory_utilization"]
        return SUCCESS

    def nvmlDeviceGetPcieReplayCounter(self, state: Any, gpu: Any, mig: Any, out: Any) -> None:
        put(out, gpu["pcie_replay"])

    def nvmlDeviceGetCurrentClocksEventReasons(
        self, state: Any, gpu: Any, mig: Any, out: Any
    ) -> None:
        bits = 0
        for reason in gpu.get("throttle", []):
            bits |= THROTTLE_BITS[reason]
        if not bits and utilization(state, gpu) == 0:
            bits = THROTTLE_BITS["gpu_idle"]
        put(out, bits)

    # -- MIG ------------------------------------------------------------------------

    def nvmlDeviceGetMigMode(
        self, state: Any, gpu: Any, mig: Any, current: Any, pending: Any
    ) -> int:
        if lacks(gpu, cards.MIG):
            return NOT_SUPPORTED
        put(current, 1 if gpu.get("mig") else 0)
        put(pending, 1 if gpu.get("mig") else 0)
        return SUCCESS

    def nvmlDeviceGetMaxMigDeviceCount(self, state: Any, gpu: Any, mig: Any, out: Any) -> int:
        if lacks(gpu, cards.MIG):
            return NOT_SUPPORTED
        put(out, gpu["max_mig"])
        return SUCCESS

    def nvmlDeviceGetMigDeviceHandleByIndex(
        self, state: Any, gpu: Any, mig: Any, index: Any, out: Any
    ) -> int:
        if lacks(gpu, cards.MIG):
            return NOT_SUPPORTED
        if not gpu.get("mig"):
            return INVALID_ARGUMENT
        i = val(index)
        if i >= gpu["max_mig"]:
            return INVALID_ARGUMENT
        if i >= len(gpu["mig_instances"]):
            return NOT_FOUND
        put_pointer(out, handle(gpu, gpu["mig_instances"][i]))
        return SUCCESS

    def nvmlDeviceGetGpuInstanceId(self, state: Any, gpu: Any, mig: Any, out: Any) -> int:
        if mig is None:
            return INVALID_ARGUMENT
        put(out, mig["gpu_instance_id"])
        return SUCCESS

    def nvmlDeviceGetComputeInstanceId(self, state: Any, gpu: Any, mig: Any, out: Any) -> int:
        if mig is None:
            return INVALID_ARGUMENT
        put(out, mig["compute_instance_id"])
        return SUCCESS

    # -- health ---------------------------------------------------------------------

    def nvmlDeviceGetEccMode(
        self, state: Any, gpu: Any, mig: Any, current: Any, pending: Any
    ) -> int:
        if lacks(gpu, cards.ECC):
            return NOT_SUPPORTED
        put(current, 1 if gpu["ecc"] else 0)
        put(pending, 1 if gpu["ecc"] else 0)
        return SUCCESS

    def nvmlDeviceGetTotalEccErrors(
        self, state: Any, gpu: Any, mig: Any, kind: Any, counter: Any, out: Any
    ) -> int:
        if lacks(gpu, cards.ECC) or not gpu["ecc"]:
            return NOT_SUPPORTED
        put(out, gpu["ecc_uncorrected"] if val(kind) == 1 else gpu["ecc_corrected"])
        return SUCCESS

    def nvmlDeviceGetRetiredPagesPendingStatus(
        self, state: Any, gpu: Any, mig: Any, out: Any
    ) -> int:
        if lacks(gpu, cards.RETIRE):
            return NOT_SUPPORTED
        put(out, 1 if gpu["retired_pages_pending"] else 0)
        return SUCCESS

    def nvmlDeviceGetRemappedRows(
        self, state: Any, gpu: Any, mig: Any, corr: Any, unc: Any, pending: Any, failure: Any
    ) -> int:
        if lacks(gpu, cards.REMAP):
            return NOT_SUPPORTED
        put(corr, 0)
        put(unc, 1 if gpu["remapped_rows_pending"] else 0)
        put(pending, 1 if gpu["remapped_rows_pending"] else 0)
        put(failure, 1 if gpu["remapped_rows_failure"] else 0)
        return SUCCESS

    # -- processes ------------------------------------------------------------------

    def _processes(
        self, state: Any, gpu: Any, mig: Any, kind: str, count_ref: Any, array: Any
    ) -> int:
        procs = [
            p
            for p in live_processes(state)
            if p["gpu"] == gpu["uuid"]
            and p.get("kind", "compute") == kind
            and (mig is None or p.get("mig") == mig["index"])
        ]
        count = obj(count_ref)
        if array is None or count.value < len(procs):
            count.value = len(procs)
            return INSUFFICIENT_SIZE if procs else SUCCESS
        fields = {name for name, _ in type(array[0])._fields_} if len(procs) else set()
        instances = gpu.get("mig_instances", [])
        for i, p in enumerate(procs):
            entry = array[i]
            entry.pid = p["pid"]
            entry.usedGpuMemory = p["memory"]
            if "gpuInstanceId" in fields:
                inst = instances[p["mig"]] if gpu.get("mig") and p.get("mig") is not None else None
                entry.gpuInstanceId = inst["gpu_instance_id"] if inst else NO_INSTANCE
                entry.computeInstanceId = inst["compute_instance_id"] if inst else NO_INSTANCE
        count.value = len(procs)
        return SUCCESS

    def nvmlDeviceGetComputeRunningProcesses_v3(
        self, state: Any, gpu: Any, mig: Any, count: Any, array: Any
    ) -> int:
        return self._processes(state, gpu, mig, "compute", count, array)

    def nvmlDeviceGetGraphicsRunningProcesses_v3(
        self, state: Any, gpu: Any, mig: Any, count: Any, array: Any
    ) -> int:
        return self._processes(state, gpu, mig, "graphics", count, array)

    def nvmlDeviceGetMPSComputeRunningProcesses_v3(
        self, state: Any, gpu: Any, mig: Any, count: Any, array: Any
    ) -> int:
        return self._processes(state, gpu, mig, "mps", count, array)


def process_table(state: dict[str, Any]) -> dict[int, tuple[Optional[str], Optional[str]]]:
    """pid -> (user, command) for processes the spec or `Machine.add_process` described.
    Real NVML knows no users; the inventory reads this instead of psutil for those pids."""
    return {
        p["pid"]: (p.get("user"), p.get("command"))
        for p in live_processes(state)
        if p.get("user") or p.get("command")
    }
