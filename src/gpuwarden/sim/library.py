"""The fake `libnvidia-ml.so.1`: NVML's C functions, answered from the machine's state.

nvidia-ml-py's wrappers call C functions through `_nvmlGetFunctionPointer(name)`,
passing ctypes objects (`byref(c_uint())`, string buffers, struct arrays) and
checking an integer return code. This module provides those functions with the
same names, arguments and return codes, so the real wrappers, their struct
versions and their error classes all run unchanged on top of it; so does any
client (gpustat, nvitop) that calls function pointers itself. A symbol not here
raises NVMLError_FunctionNotFound from the real lookup code, as it does with an
older driver, and clients fall back as they would there.

Per call: not initialised -> NVML_ERROR_UNINITIALIZED; a feature the card lacks
-> NVML_ERROR_NOT_SUPPORTED; a lost GPU -> NVML_ERROR_GPU_IS_LOST on everything
except its identity (UUID, PCI info, name, serial, index), which the driver
keeps from when the GPU was attached.
"""

from __future__ import annotations

import ctypes
import time

from gpuwarden.sim import cards, specs
from gpuwarden.sim.state import StateFile, live_processes, memory_used

TYPE_CHECKING = False  # typing stays off the start-up path; annotations need it only here
if TYPE_CHECKING:
    from typing import Any, Callable, Optional

SUCCESS = 0
UNINITIALIZED = 1
INVALID_ARGUMENT = 2
NOT_SUPPORTED = 3
NOT_FOUND = 6
INSUFFICIENT_SIZE = 7
TIMEOUT = 10
GPU_IS_LOST = 15
ARGUMENT_VERSION_MISMATCH = 25

_HANDLE_BASE = 0x4E564D4C0000  # "NVML": handles are opaque pointers never dereferenced
_EVENT_BASE = 0x4E5645000000
_XID_EVENT = 0x8
_NO_INSTANCE = 0xFFFFFFFF
_IDENTITY = {
    "nvmlDeviceGetUUID",
    "nvmlDeviceGetPciInfo_v3",
    "nvmlDeviceGetPciInfo_v2",
    "nvmlDeviceGetPciInfo",
    "nvmlDeviceGetName",
    "nvmlDeviceGetSerial",
    "nvmlDeviceGetIndex",
    "nvmlDeviceGetMinorNumber",
    "nvmlDeviceIsMigDeviceHandle",
}
# Functions that work on a MIG device handle; everything else answers NOT_SUPPORTED there.
_MIG_OK = _IDENTITY | {
    "nvmlDeviceGetMemoryInfo",
    "nvmlDeviceGetMemoryInfo_v2",
    "nvmlDeviceGetComputeRunningProcesses",
    "nvmlDeviceGetComputeRunningProcesses_v2",
    "nvmlDeviceGetComputeRunningProcesses_v3",
    "nvmlDeviceGetGraphicsRunningProcesses",
    "nvmlDeviceGetGraphicsRunningProcesses_v2",
    "nvmlDeviceGetGraphicsRunningProcesses_v3",
    "nvmlDeviceGetMPSComputeRunningProcesses_v3",
    "nvmlDeviceGetGpuInstanceId",
    "nvmlDeviceGetComputeInstanceId",
    "nvmlDeviceGetDeviceHandleFromMigDeviceHandle",
    "nvmlDeviceGetCudaComputeCapability",
    "nvmlDeviceGetMaxMigDeviceCount",
    "nvmlDeviceGetAttributes_v2",
}


def _val(x: Any) -> Any:
    return getattr(x, "value", x)


def _obj(ref: Any) -> Any:
    """The ctypes object behind `byref(obj)` (or the object itself)."""
    return getattr(ref, "_obj", ref)


def _put(ref: Any, value: Any) -> None:
    _obj(ref).value = value


def _put_pointer(ref: Any, address: int) -> None:
    out = _obj(ref)
    ctypes.memmove(
        ctypes.addressof(out),
        ctypes.byref(ctypes.c_void_p(address)),
        ctypes.sizeof(ctypes.c_void_p),
    )


def _address(handle: Any) -> Optional[int]:
    try:
        return ctypes.cast(handle, ctypes.c_void_p).value
    except (ctypes.ArgumentError, TypeError):
        return None


def _text(x: Any) -> str:
    value = _val(x)
    return value.decode() if isinstance(value, bytes) else str(value)


def _bus_key(bus: str) -> tuple[int, int, int, int]:
    """PCI bus id in any of NVML's accepted spellings, as numbers."""
    parts = bus.strip().lower().replace(".", ":").split(":")
    if len(parts) == 3:
        parts = ["0", *parts]
    return (int(parts[0], 16), int(parts[1], 16), int(parts[2], 16), int(parts[3], 16))


class _Fn:
    """A C function pointer stand-in: callable, and takes attributes (`fn.restype = ...`)."""

    def __init__(self, func: Callable[..., Any], name: str) -> None:
        self._func = func
        self.__name__ = name

    def __call__(self, *args: Any) -> Any:
        return self._func(*args)


class FakeLibrary:
    """What `CDLL("libnvidia-ml.so.1")` would be, for one simulated machine."""

    def __init__(self, spec: specs.Spec, nv: Any, state_dir: Optional[str] = None) -> None:
        self.spec = spec
        self.nv = nv  # the pynvml copy on top, for its struct types
        self.file = StateFile(spec, state_dir)
        self.refs = 0
        self.event_sets: dict[int, dict[str, Any]] = {}
        for name in dir(type(self)):
            if name.startswith("nvml"):
                setattr(self, name, _Fn(self._guarded(name, getattr(self, name)), name))
        for alias, target in _ALIASES.items():
            setattr(
                self,
                alias,
                _Fn(self._guarded(alias, getattr(type(self), target).__get__(self)), alias),
            )

    # -- plumbing ---------------------------------------------------------------

    def _guarded(self, name: str, method: Callable[..., Any]) -> Callable[..., Any]:
        if name.startswith("nvmlInit") or name == "nvmlErrorString":
            return method
        device = name.startswith("nvmlDevice") and name not in {
            "nvmlDeviceGetCount",
            "nvmlDeviceGetCount_v2",
            "nvmlDeviceGetHandleByIndex",
            "nvmlDeviceGetHandleByIndex_v2",
            "nvmlDeviceGetHandleByUUID",
            "nvmlDeviceGetHandleByPciBusId",
            "nvmlDeviceGetHandleByPciBusId_v2",
        }
        identity = name in _IDENTITY
        mig_ok = name in _MIG_OK
        two_devices = name == "nvmlDeviceGetTopologyCommonAncestor"

        def call(*args: Any) -> Any:
            if self.refs <= 0:
                return UNINITIALIZED
            if not device:
                return method(*args) or SUCCESS
            state = self.file.read()
            found = self._resolve(state, args[0])
            if found is None:
                return INVALID_ARGUMENT
            gpu, mig = found
            if gpu.get("lost") and not identity:
                return GPU_IS_LOST
            if mig is not None and not mig_ok:
                return NOT_SUPPORTED
            if two_devices:
                other = self._resolve(state, args[1])
                if other is None:
                    return INVALID_ARGUMENT
                return method(state, gpu, other[0], *args[2:]) or SUCCESS
            return method(state, gpu, mig, *args[1:]) or SUCCESS

        return call

    def _resolve(self, state: dict[str, Any], handle: Any) -> Optional[tuple[dict[str, Any], Any]]:
        address = _address(handle)
        if address is None or address <= _HANDLE_BASE:
            return None
        offset = address - _HANDLE_BASE
        index, mig = divmod(offset, 0x100)
        index -= 1
        if not 0 <= index < len(state["gpus"]):
            return None
        gpu = state["gpus"][index]
        if mig == 0:
            return gpu, None
        instances = gpu.get("mig_instances", [])
        if not gpu.get("mig") or mig > len(instances):
            return None
        return gpu, instances[mig - 1]

    @staticmethod
    def _handle(gpu: dict[str, Any], mig: Optional[dict[str, Any]] = None) -> int:
        return _HANDLE_BASE + 0x100 * (gpu["index"] + 1) + (0 if mig is None else mig["index"] + 1)

    @staticmethod
    def _unsupported(gpu: dict[str, Any], feature: str) -> bool:
        return feature in gpu["unsupported"]

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
        return self.nv.NVMLError._errcode_to_string.get(_val(result), "Unknown Error").encode()

    # -- system -----------------------------------------------------------------

    def nvmlSystemGetDriverVersion(self, buf: Any, size: Any) -> None:
        buf.value = self.file.read()["driver_version"].encode()

    def nvmlSystemGetNVMLVersion(self, buf: Any, size: Any) -> None:
        state = self.file.read()
        buf.value = f"{state['cuda_version'] // 1000}.{state['driver_version']}".encode()

    def nvmlSystemGetCudaDriverVersion(self, out: Any) -> None:
        _put(out, self.file.read()["cuda_version"])

    def nvmlSystemGetProcessName(self, pid: Any, buf: Any, size: Any) -> int:
        pid = _val(pid)
        for p in live_processes(self.file.read()):
            if p["pid"] == pid and p.get("command"):
                buf.value = p["command"].split()[0].encode()[: _val(size) - 1]
                return SUCCESS
        try:
            with open(f"/proc/{pid}/comm", "rb") as handle:
                buf.value = handle.read().strip()[: _val(size) - 1]
        except OSError:
            return NOT_FOUND
        return SUCCESS

    # -- enumeration ------------------------------------------------------------

    def nvmlDeviceGetCount_v2(self, out: Any) -> None:
        _put(out, len(self.file.read()["gpus"]))

    def nvmlDeviceGetHandleByIndex_v2(self, index: Any, out: Any) -> int:
        gpus = self.file.read()["gpus"]
        i = _val(index)
        if not 0 <= i < len(gpus):
            return INVALID_ARGUMENT
        _put_pointer(out, self._handle(gpus[i]))
        return SUCCESS

    def nvmlDeviceGetHandleByUUID(self, uuid: Any, out: Any) -> int:
        text = _text(uuid)
        for gpu in self.file.read()["gpus"]:
            if gpu["uuid"] == text:
                _put_pointer(out, self._handle(gpu))
                return SUCCESS
            for mig in gpu.get("mig_instances", []) if gpu.get("mig") else []:
                if mig["uuid"] == text:
                    _put_pointer(out, self._handle(gpu, mig))
                    return SUCCESS
        return NOT_FOUND

    def nvmlDeviceGetHandleByPciBusId_v2(self, bus: Any, out: Any) -> int:
        try:
            key = _bus_key(_text(bus))
        except ValueError:
            return INVALID_ARGUMENT
        for gpu in self.file.read()["gpus"]:
            if _bus_key(gpu["pci_bus_id"]) == key:
                _put_pointer(out, self._handle(gpu))
                return SUCCESS
        return NOT_FOUND

    # -- identity ---------------------------------------------------------------

    def nvmlDeviceGetName(self, state: Any, gpu: Any, mig: Any, buf: Any, size: Any) -> None:
        name = gpu["name"] if mig is None else f"{gpu['name']} MIG {mig['profile']}"
        buf.value = name.encode()[: _val(size) - 1]

    def nvmlDeviceGetUUID(self, state: Any, gpu: Any, mig: Any, buf: Any, size: Any) -> None:
        buf.value = (gpu if mig is None else mig)["uuid"].encode()

    def nvmlDeviceGetSerial(self, state: Any, gpu: Any, mig: Any, buf: Any, size: Any) -> int:
        if "GeForce" in gpu["name"]:
            return NOT_SUPPORTED
        buf.value = gpu["serial"].encode()
        return SUCCESS

    def nvmlDeviceGetIndex(self, state: Any, gpu: Any, mig: Any, out: Any) -> None:
        _put(out, gpu["index"])

    def nvmlDeviceGetMinorNumber(self, state: Any, gpu: Any, mig: Any, out: Any) -> int:
        if mig is not None:  # a MIG device has no /dev/nvidiaN of its own
            return NOT_SUPPORTED
        _put(out, gpu.get("minor", gpu["index"]))  # state files written before minors existed
        return SUCCESS

    def nvmlDeviceGetPciInfo_v3(self, state: Any, gpu: Any, mig: Any, ref: Any) -> None:
        info = _obj(ref)
        domain, bus, device, _ = _bus_key(gpu["pci_bus_id"])
        info.busIdLegacy = gpu["pci_bus_id"][4:].encode()
        info.busId = gpu["pci_bus_id"].encode()
        info.domain, info.bus, info.device = domain, bus, device
        info.pciDeviceId = gpu["pci_device_id"]
        info.pciSubSystemId = gpu["pci_subsystem_id"]

    def nvmlDeviceGetCudaComputeCapability(
        self, state: Any, gpu: Any, mig: Any, major: Any, minor: Any
    ) -> None:
        _put(major, gpu["compute_capability"][0])
        _put(minor, gpu["compute_capability"][1])

    # -- memory, load, sensors --------------------------------------------------

    def _memory(self, state: dict[str, Any], gpu: dict[str, Any], mig: Any) -> tuple[int, int, int]:
        """(total, reserved, used) as the v2 struct reports them."""
        if mig is not None:
            used = memory_used(state, gpu, mig["index"])
            return mig["memory_total"], 0, used + 13 * cards.MiB
        return gpu["memory_total"], gpu["memory_reserved"], memory_used(state, gpu)

    def nvmlDeviceGetMemoryInfo(self, state: Any, gpu: Any, mig: Any, ref: Any) -> None:
        total, reserved, used = self._memory(state, gpu, mig)
        out = _obj(ref)
        out.total, out.used, out.free = total, used + reserved, total - used - reserved

    def nvmlDeviceGetMemoryInfo_v2(self, state: Any, gpu: Any, mig: Any, ref: Any) -> int:
        out = _obj(ref)
        if out.version != self.nv.nvmlMemory_v2:
            return ARGUMENT_VERSION_MISMATCH
        total, reserved, used = self._memory(state, gpu, mig)
        out.total, out.reserved, out.used, out.free = total, reserved, used, total - used - reserved
        return SUCCESS

    def nvmlDeviceGetBAR1MemoryInfo(self, state: Any, gpu: Any, mig: Any, ref: Any) -> None:
        out = _obj(ref)
        datacenter = not self._unsupported(gpu, cards.MIG)
        total = 2 * gpu["memory_total"] if datacenter else 256 * cards.MiB
        used = 5 * cards.MiB
        out.bar1Total, out.bar1Used, out.bar1Free = total, used, total - used

    def _utilization(self, state: dict[str, Any], gpu: dict[str, Any]) -> int:
        extra = sum(
            p.get("util", 0)
            for p in live_processes(state)
            if p["gpu"] == gpu["uuid"] and not p.get("synthetic")
        )
        return min(100, gpu["utilization"] + extra)

    def nvmlDeviceGetUtilizationRates(self, state: Any, gpu: Any, mig: Any, ref: Any) -> int:
        if gpu.get("mig"):
            return NOT_SUPPORTED  # per-instance load is only in DCGM
        out = _obj(ref)
        out.gpu = self._utilization(state, gpu)
        out.memory = gpu["memory_utilization"]
        return SUCCESS

    def nvmlDeviceGetEncoderUtilization(
        self, state: Any, gpu: Any, mig: Any, util: Any, period: Any
    ) -> None:
        _put(util, 0)
        _put(period, 167000)

    def nvmlDeviceGetDecoderUtilization(
        self, state: Any, gpu: Any, mig: Any, util: Any, period: Any
    ) -> None:
        _put(util, 0)
        _put(period, 167000)

    def nvmlDeviceGetTemperature(
        self, state: Any, gpu: Any, mig: Any, sensor: Any, out: Any
    ) -> int:
        if _val(sensor) != 0:
            return INVALID_ARGUMENT
        _put(out, gpu["temperature"])
        return SUCCESS

    def nvmlDeviceGetTemperatureThreshold(
        self, state: Any, gpu: Any, mig: Any, kind: Any, out: Any
    ) -> int:
        values = {0: 92, 1: 89, 2: 87, 3: 83}  # shutdown, slowdown, mem max, gpu max
        value = values.get(_val(kind))
        if value is None:
            return NOT_SUPPORTED
        _put(out, value)
        return SUCCESS

    def nvmlDeviceGetPowerUsage(self, state: Any, gpu: Any, mig: Any, out: Any) -> None:
        _put(out, round(gpu["power"] * 1000))

    def nvmlDeviceGetEnforcedPowerLimit(self, state: Any, gpu: Any, mig: Any, out: Any) -> None:
        _put(out, int(gpu["power_limit"] * 1000))

    def nvmlDeviceGetPowerManagementLimitConstraints(
        self, state: Any, gpu: Any, mig: Any, low: Any, high: Any
    ) -> None:
        _put(low, int(gpu["power_limit"] * 250))
        _put(high, int(gpu["power_limit"] * 1000))

    def nvmlDeviceGetTotalEnergyConsumption(self, state: Any, gpu: Any, mig: Any, out: Any) -> None:
        # CLOCK_MONOTONIC is shared by every process, so all readers agree and it only grows.
        _put(out, int(gpu["energy_base"] + gpu["power"] * time.monotonic() * 1000))

    def nvmlDeviceGetNumFans(self, state: Any, gpu: Any, mig: Any, out: Any) -> int:
        if self._unsupported(gpu, cards.FAN):
            return NOT_SUPPORTED
        _put(out, 1)
        return SUCCESS

    def nvmlDeviceGetFanSpeed(self, state: Any, gpu: Any, mig: Any, out: Any) -> int:
        return self._fan(gpu, out)

    def nvmlDeviceGetFanSpeed_v2(self, state: Any, gpu: Any, mig: Any, fan: Any, out: Any) -> int:
        if _val(fan) != 0:
            return INVALID_ARGUMENT
        return self._fan(gpu, out)

    def _fan(self, gpu: dict[str, Any], out: Any) -> int:
        if self._unsupported(gpu, cards.FAN) or gpu.get("fan") is None:
            return NOT_SUPPORTED
        _put(out, gpu["fan"])
        return SUCCESS

    def _clock(self, gpu: dict[str, Any], kind: int, maximum: bool) -> Optional[int]:
        if kind in (0, 1):  # graphics, SM
            return gpu["clock_sm_max"] if maximum else gpu["clock_sm"]
        if kind == 2:
            return gpu["clock_mem_max"]
        if kind == 3:
            return int(gpu["clock_sm_max"] * 0.9) if maximum else int(gpu["clock_sm"] * 0.9)
        return None

    def nvmlDeviceGetClockInfo(self, state: Any, gpu: Any, mig: Any, kind: Any, out: Any) -> int:
        value = self._clock(gpu, _val(kind), False)
        if value is None:
            return INVALID_ARGUMENT
        _put(out, value)
        return SUCCESS

    def nvmlDeviceGetMaxClockInfo(self, state: Any, gpu: Any, mig: Any, kind: Any, out: Any) -> int:
        value = self._clock(gpu, _val(kind), True)
        if value is None:
            return INVALID_ARGUMENT
        _put(out, value)
        return SUCCESS

    def nvmlDeviceGetPerformanceState(self, state: Any, gpu: Any, mig: Any, out: Any) -> None:
        # Data-centre cards in persistence mode stay in P0; others drop to P8 when idle.
        busy = self._utilization(state, gpu) > 0
        datacenter = not self._unsupported(gpu, cards.MIG)
        _put(out, 0 if busy or (gpu["persistence"] and datacenter) else 8)

    def nvmlDeviceGetPcieReplayCounter(self, state: Any, gpu: Any, mig: Any, out: Any) -> None:
        _put(out, gpu["pcie_replay"])

    def nvmlDeviceGetCurrentClocksEventReasons(
        self, state: Any, gpu: Any, mig: Any, out: Any
    ) -> None:
        bits = 0
        for reason in gpu.get("throttle", []):
            bits |= specs.THROTTLE_BITS[reason]
        if not bits and self._utilization(state, gpu) == 0:
            bits = specs.THROTTLE_BITS["gpu_idle"]
        _put(out, bits)

    def nvmlDeviceGetSupportedClocksEventReasons(
        self, state: Any, gpu: Any, mig: Any, out: Any
    ) -> None:
        bits = 0
        for value in specs.THROTTLE_BITS.values():
            bits |= value
        _put(out, bits)

    # -- modes --------------------------------------------------------------------

    def nvmlDeviceGetPersistenceMode(self, state: Any, gpu: Any, mig: Any, out: Any) -> None:
        _put(out, 1 if gpu["persistence"] else 0)

    def nvmlDeviceGetComputeMode(self, state: Any, gpu: Any, mig: Any, out: Any) -> None:
        _put(out, specs.COMPUTE_MODES[gpu["compute_mode"]])

    def nvmlDeviceGetDisplayMode(self, state: Any, gpu: Any, mig: Any, out: Any) -> int:
        return self._display(gpu, out)

    def nvmlDeviceGetDisplayActive(self, state: Any, gpu: Any, mig: Any, out: Any) -> int:
        return self._display(gpu, out)

    def _display(self, gpu: dict[str, Any], out: Any) -> int:
        if self._unsupported(gpu, cards.DISPLAY):
            return NOT_SUPPORTED
        _put(out, 0)
        return SUCCESS

    # -- MIG ------------------------------------------------------------------------

    def nvmlDeviceGetMigMode(
        self, state: Any, gpu: Any, mig: Any, current: Any, pending: Any
    ) -> int:
        if self._unsupported(gpu, cards.MIG):
            return NOT_SUPPORTED
        _put(current, 1 if gpu.get("mig") else 0)
        _put(pending, 1 if gpu.get("mig") else 0)
        return SUCCESS

    def nvmlDeviceGetMaxMigDeviceCount(self, state: Any, gpu: Any, mig: Any, out: Any) -> int:
        if self._unsupported(gpu, cards.MIG):
            return NOT_SUPPORTED
        _put(out, gpu["max_mig"])
        return SUCCESS

    def nvmlDeviceGetMigDeviceHandleByIndex(
        self, state: Any, gpu: Any, mig: Any, index: Any, out: Any
    ) -> int:
        if self._unsupported(gpu, cards.MIG):
            return NOT_SUPPORTED
        if not gpu.get("mig"):
            return INVALID_ARGUMENT
        i = _val(index)
        if i >= gpu["max_mig"]:
            return INVALID_ARGUMENT
        if i >= len(gpu["mig_instances"]):
            return NOT_FOUND
        _put_pointer(out, self._handle(gpu, gpu["mig_instances"][i]))
        return SUCCESS

    def nvmlDeviceGetDeviceHandleFromMigDeviceHandle(
        self, state: Any, gpu: Any, mig: Any, out: Any
    ) -> int:
        if mig is None:
            return INVALID_ARGUMENT
        _put_pointer(out, self._handle(gpu))
        return SUCCESS

    def nvmlDeviceIsMigDeviceHandle(self, state: Any, gpu: Any, mig: Any, out: Any) -> None:
        _put(out, 0 if mig is None else 1)

    def nvmlDeviceGetGpuInstanceId(self, state: Any, gpu: Any, mig: Any, out: Any) -> int:
        if mig is None:
            return INVALID_ARGUMENT
        _put(out, mig["gpu_instance_id"])
        return SUCCESS

    def nvmlDeviceGetComputeInstanceId(self, state: Any, gpu: Any, mig: Any, out: Any) -> int:
        if mig is None:
            return INVALID_ARGUMENT
        _put(out, mig["compute_instance_id"])
        return SUCCESS

    # -- health ---------------------------------------------------------------------

    def nvmlDeviceGetEccMode(
        self, state: Any, gpu: Any, mig: Any, current: Any, pending: Any
    ) -> int:
        if self._unsupported(gpu, cards.ECC):
            return NOT_SUPPORTED
        _put(current, 1 if gpu["ecc"] else 0)
        _put(pending, 1 if gpu["ecc"] else 0)
        return SUCCESS

    def nvmlDeviceGetTotalEccErrors(
        self, state: Any, gpu: Any, mig: Any, kind: Any, counter: Any, out: Any
    ) -> int:
        if self._unsupported(gpu, cards.ECC) or not gpu["ecc"]:
            return NOT_SUPPORTED
        _put(out, gpu["ecc_uncorrected"] if _val(kind) == 1 else gpu["ecc_corrected"])
        return SUCCESS

    def nvmlDeviceGetRetiredPagesPendingStatus(
        self, state: Any, gpu: Any, mig: Any, out: Any
    ) -> int:
        if self._unsupported(gpu, cards.RETIRE):
            return NOT_SUPPORTED
        _put(out, 1 if gpu["retired_pages_pending"] else 0)
        return SUCCESS

    def nvmlDeviceGetRemappedRows(
        self, state: Any, gpu: Any, mig: Any, corr: Any, unc: Any, pending: Any, failure: Any
    ) -> int:
        if self._unsupported(gpu, cards.REMAP):
            return NOT_SUPPORTED
        _put(corr, 0)
        _put(unc, 1 if gpu["remapped_rows_pending"] else 0)
        _put(pending, 1 if gpu["remapped_rows_pending"] else 0)
        _put(failure, 1 if gpu["remapped_rows_failure"] else 0)
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
        count = _obj(count_ref)
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
                entry.gpuInstanceId = inst["gpu_instance_id"] if inst else _NO_INSTANCE
                entry.computeInstanceId = inst["compute_instance_id"] if inst else _NO_INSTANCE
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

    def nvmlDeviceGetProcessUtilization(
        self, state: Any, gpu: Any, mig: Any, array: Any, count_ref: Any, since: Any
    ) -> int:
        procs = [p for p in live_processes(state) if p["gpu"] == gpu["uuid"]]
        count = _obj(count_ref)
        if not procs:
            return NOT_FOUND  # no samples since `since`, as the driver says for an idle GPU
        if array is None or count.value < len(procs):
            count.value = len(procs)
            return INSUFFICIENT_SIZE
        share = self._utilization(state, gpu) // len(procs)
        mem_share = gpu["memory_utilization"] // len(procs)
        now = int(time.time() * 1e6)
        for i, p in enumerate(procs):
            entry = array[i]
            entry.pid, entry.timeStamp = p["pid"], now
            entry.smUtil, entry.memUtil, entry.encUtil, entry.decUtil = share, mem_share, 0, 0
        count.value = len(procs)
        return SUCCESS

    def nvmlDeviceGetDriverModel(
        self, state: Any, gpu: Any, mig: Any, current: Any, pending: Any
    ) -> int:
        return NOT_SUPPORTED  # WDDM/TCC exist only on Windows

    # -- topology -------------------------------------------------------------------

    def nvmlDeviceGetTopologyCommonAncestor(
        self, state: Any, gpu: Any, other: Any, out: Any
    ) -> None:
        if gpu["index"] == other["index"]:
            level = 0
        elif gpu["pcie_switch"] == other["pcie_switch"]:
            level = 10
        elif gpu["numa_node"] == other["numa_node"]:
            level = 40
        else:
            level = 50
        _put(out, level)

    def _link(self, gpu: dict[str, Any], link: Any) -> int:
        i = _val(link)
        if not 0 <= i < self.nv.NVML_NVLINK_MAX_LINKS:
            return INVALID_ARGUMENT
        if self._unsupported(gpu, cards.NVLINK) or i >= gpu["nvlinks"]:
            return NOT_SUPPORTED
        return SUCCESS

    def nvmlDeviceGetNvLinkState(self, state: Any, gpu: Any, mig: Any, link: Any, out: Any) -> int:
        code = self._link(gpu, link)
        if code == SUCCESS:
            _put(out, 1 if state.get("nvswitch") else 0)
        return code

    def nvmlDeviceGetNvLinkRemoteDeviceType(
        self, state: Any, gpu: Any, mig: Any, link: Any, out: Any
    ) -> int:
        code = self._link(gpu, link)
        if code == SUCCESS:
            _put(
                out,
                self.nv.NVML_NVLINK_DEVICE_TYPE_SWITCH
                if state.get("nvswitch")
                else self.nv.NVML_NVLINK_DEVICE_TYPE_UNKNOWN,
            )
        return code

    def nvmlDeviceGetNvLinkRemotePciInfo_v2(
        self, state: Any, gpu: Any, mig: Any, link: Any, ref: Any
    ) -> int:
        code = self._link(gpu, link)
        if code != SUCCESS:
            return code
        if not state.get("nvswitch"):
            return NOT_SUPPORTED
        # Six NVSwitches on the baseboard; each GPU's links fan out across them.
        switch = _val(link) % 6
        bus = f"00000000:{0xC4 + switch:02X}:00.0"
        info = _obj(ref)
        info.busId = bus.encode()
        info.busIdLegacy = bus[4:].encode()
        info.domain, info.bus, info.device = 0, 0xC4 + switch, 0
        info.pciDeviceId = 0x1AF110DE
        return SUCCESS

    # -- events ---------------------------------------------------------------------

    def nvmlEventSetCreate(self, out: Any) -> None:
        address = _EVENT_BASE + len(self.event_sets) + 1
        self.event_sets[address] = {"devices": {}, "seq": self.file.read().get("seq", 0)}
        _put_pointer(out, address)

    def nvmlDeviceGetSupportedEventTypes(self, state: Any, gpu: Any, mig: Any, out: Any) -> None:
        _put(out, _XID_EVENT | 0x1 | 0x2 | 0x4 | 0x10)

    def nvmlDeviceRegisterEvents(
        self, state: Any, gpu: Any, mig: Any, types: Any, event_set: Any
    ) -> int:
        entry = self.event_sets.get(_address(event_set) or 0)
        if entry is None:
            return INVALID_ARGUMENT
        entry["devices"][gpu["uuid"]] = entry["devices"].get(gpu["uuid"], 0) | _val(types)
        return SUCCESS

    def nvmlEventSetWait_v2(self, event_set: Any, ref: Any, timeout_ms: Any) -> int:
        entry = self.event_sets.get(_address(event_set) or 0)
        if entry is None:
            return INVALID_ARGUMENT
        deadline = time.monotonic() + _val(timeout_ms) / 1000.0
        while True:
            state = self.file.read()
            for event in state.get("events", []):
                if event["seq"] <= entry["seq"]:
                    continue
                entry["seq"] = event["seq"]
                if entry["devices"].get(event["gpu"], 0) & _XID_EVENT:
                    gpu = next(g for g in state["gpus"] if g["uuid"] == event["gpu"])
                    data = _obj(ref)
                    data.device = ctypes.cast(
                        ctypes.c_void_p(self._handle(gpu)), self.nv.c_nvmlDevice_t
                    )
                    data.eventType = _XID_EVENT
                    data.eventData = event["xid"]
                    data.gpuInstanceId = _NO_INSTANCE
                    data.computeInstanceId = _NO_INSTANCE
                    return SUCCESS
            left = deadline - time.monotonic()
            if left <= 0:
                return TIMEOUT
            time.sleep(min(0.02, left))

    def nvmlEventSetFree(self, event_set: Any) -> int:
        if self.event_sets.pop(_address(event_set) or 0, None) is None:
            return INVALID_ARGUMENT
        return SUCCESS


# Symbol -> the method that answers it (older or newer names of the same C function).
_ALIASES = {
    "nvmlInit": "nvmlInit_v2",
    "nvmlSystemGetCudaDriverVersion_v2": "nvmlSystemGetCudaDriverVersion",
    "nvmlDeviceGetCount": "nvmlDeviceGetCount_v2",
    "nvmlDeviceGetHandleByIndex": "nvmlDeviceGetHandleByIndex_v2",
    "nvmlDeviceGetHandleByPciBusId": "nvmlDeviceGetHandleByPciBusId_v2",
    "nvmlDeviceGetPciInfo": "nvmlDeviceGetPciInfo_v3",
    "nvmlDeviceGetPciInfo_v2": "nvmlDeviceGetPciInfo_v3",
    "nvmlDeviceGetPowerManagementLimit": "nvmlDeviceGetEnforcedPowerLimit",
    "nvmlDeviceGetPowerManagementDefaultLimit": "nvmlDeviceGetEnforcedPowerLimit",
    "nvmlDeviceGetCurrentClocksThrottleReasons": "nvmlDeviceGetCurrentClocksEventReasons",
    "nvmlDeviceGetSupportedClocksThrottleReasons": "nvmlDeviceGetSupportedClocksEventReasons",
    "nvmlDeviceGetComputeRunningProcesses": "nvmlDeviceGetComputeRunningProcesses_v3",
    "nvmlDeviceGetComputeRunningProcesses_v2": "nvmlDeviceGetComputeRunningProcesses_v3",
    "nvmlDeviceGetGraphicsRunningProcesses": "nvmlDeviceGetGraphicsRunningProcesses_v3",
    "nvmlDeviceGetGraphicsRunningProcesses_v2": "nvmlDeviceGetGraphicsRunningProcesses_v3",
    "nvmlDeviceGetNvLinkRemotePciInfo": "nvmlDeviceGetNvLinkRemotePciInfo_v2",
    "nvmlEventSetWait": "nvmlEventSetWait_v2",
}


def process_table(state: dict[str, Any]) -> dict[int, tuple[Optional[str], Optional[str]]]:
    """pid -> (user, command) for processes the spec or `Machine.add_process` described.
    Real NVML knows no users; the inventory reads this instead of psutil for those pids."""
    return {
        p["pid"]: (p.get("user"), p.get("command"))
        for p in live_processes(state)
        if p.get("user") or p.get("command")
    }
