"""NVML's C interface, as the fake library speaks it.

The symbols it answers (with their older and newer names, the per-symbol rules
for lost GPUs and MIG handles, and which module answers each one loaded on first
need), return codes, the opaque device handles it hands out, and reading and
writing the ctypes arguments nvidia-ml-py passes (`byref(c_uint())`, string
buffers, struct pointers). Shared by `library` and the modules it loads on first
need (`sensors`, `links`, `events`, `handles`, `procinfo`, `board`, `pcie`, `clocks`,
`gpm`, `ecc`, `fields`), which must not import `library` itself: each of them is
imported from inside it.
"""

from __future__ import annotations

import ctypes

TYPE_CHECKING = False  # typing stays off the start-up path; annotations need it only here
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any, Optional

SUCCESS = 0
UNINITIALIZED = 1
INVALID_ARGUMENT = 2
NOT_SUPPORTED = 3
NOT_FOUND = 6
NO_PERMISSION = 4
INSUFFICIENT_SIZE = 7
TIMEOUT = 10
GPU_IS_LOST = 15
ARGUMENT_VERSION_MISMATCH = 25

HANDLE_BASE = 0x4E564D4C0000  # "NVML": handles are opaque pointers never dereferenced
NO_INSTANCE = 0xFFFFFFFF  # a process or event outside any MIG instance


def handle(gpu: dict[str, Any], mig: Optional[dict[str, Any]] = None) -> int:
    """The handle of a GPU, or of one of its MIG devices: its address encodes both."""
    return HANDLE_BASE + 0x100 * (gpu["index"] + 1) + (0 if mig is None else mig["index"] + 1)


def resolve(state: dict[str, Any], ref: Any) -> Optional[tuple[dict[str, Any], Any]]:
    """(GPU, MIG instance or None) in `state` for a handle; None for one no GPU has."""
    where = address(ref)
    if where is None or where <= HANDLE_BASE:
        return None
    offset = where - HANDLE_BASE
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


class Fn:
    """A C function pointer stand-in: callable, and takes attributes (`fn.restype = ...`)."""

    def __init__(self, func: Callable[..., Any], name: str) -> None:
        self._func = func
        self.__name__ = name

    def __call__(self, *args: Any) -> Any:
        return self._func(*args)


def val(x: Any) -> Any:
    return getattr(x, "value", x)


def obj(ref: Any) -> Any:
    """The ctypes object behind `byref(obj)` (or the object itself)."""
    return getattr(ref, "_obj", ref)


def put(ref: Any, value: Any) -> None:
    obj(ref).value = value


def put_pointer(ref: Any, address: int) -> None:
    out = obj(ref)
    ctypes.memmove(
        ctypes.addressof(out),
        ctypes.byref(ctypes.c_void_p(address)),
        ctypes.sizeof(ctypes.c_void_p),
    )


def address(handle: Any) -> Optional[int]:
    try:
        return ctypes.cast(handle, ctypes.c_void_p).value
    except (ctypes.ArgumentError, TypeError):
        return None


def text(x: Any) -> str:
    value = val(x)
    return value.decode() if isinstance(value, bytes) else str(value)


def bus_key(bus: str) -> tuple[int, int, int, int]:
    """PCI bus id in any of NVML's accepted spellings, as numbers."""
    parts = bus.strip().lower().replace(".", ":").split(":")
    if len(parts) == 3:
        parts = ["0", *parts]
    return (int(parts[0], 16), int(parts[1], 16), int(parts[2], 16), int(parts[3], 16))


def lacks(gpu: dict[str, Any], feature: str) -> bool:
    """Whether the card has no such feature (`cards.ECC`, `cards.FAN`, ...): NOT_SUPPORTED."""
    return feature in gpu["unsupported"]


# -- symbols --------------------------------------------------------------------

# Device functions that take no device handle (they find one).
NO_HANDLE = {
    "nvmlDeviceGetCount",
    "nvmlDeviceGetCount_v2",
    "nvmlDeviceGetHandleByIndex",
    "nvmlDeviceGetHandleByIndex_v2",
    "nvmlDeviceGetHandleByUUID",
    "nvmlDeviceGetHandleByPciBusId",
    "nvmlDeviceGetHandleByPciBusId_v2",
}
# Functions outside nvmlDevice* whose first argument is a device handle.
DEVICE_FIRST = {"nvmlGpmSampleGet", "nvmlGpmMigSampleGet", "nvmlGpmQueryDeviceSupport"}
# What a lost GPU still answers: the driver keeps it from when the GPU was attached.
IDENTITY = {
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
MIG_OK = IDENTITY | {
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
    "nvmlDeviceGetBAR1MemoryInfo",  # its share of the aperture (nvidia-smi's MIG table)
}
# Symbol -> the method that answers it (older or newer names of the same C function).
ALIASES = {
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
    "nvmlDeviceGetPowerState": "nvmlDeviceGetPerformanceState",
    "nvmlDeviceGetDriverModel_v2": "nvmlDeviceGetDriverModel",
}

# The class answering the functions of each module loaded on first need.
MIXINS = {
    "sensors": "Sensors",
    "links": "Links",
    "events": "Events",
    "handles": "Handles",
    "procinfo": "ProcessInfo",
    "board": "Board",
    "pcie": "Pcie",
    "clocks": "Clocks",
    "gpm": "Gpm",
    "ecc": "Ecc",
    "fields": "Fields",
}
# Symbol -> the module whose class answers it. Literal, so that finding where a
# function lives imports nothing; tests/test_sim.py checks it against the classes.
ELSEWHERE = {
    "nvmlDeviceGetBAR1MemoryInfo": "sensors",
    "nvmlDeviceGetEncoderUtilization": "sensors",
    "nvmlDeviceGetDecoderUtilization": "sensors",
    "nvmlDeviceGetTemperature": "sensors",
    "nvmlDeviceGetTemperatureThreshold": "sensors",
    "nvmlDeviceGetPowerUsage": "sensors",
    "nvmlDeviceGetEnforcedPowerLimit": "sensors",
    "nvmlDeviceGetPowerManagementLimitConstraints": "sensors",
    "nvmlDeviceGetTotalEnergyConsumption": "sensors",
    "nvmlDeviceGetNumFans": "sensors",
    "nvmlDeviceGetFanSpeed": "sensors",
    "nvmlDeviceGetFanSpeed_v2": "sensors",
    "nvmlDeviceGetClockInfo": "sensors",
    "nvmlDeviceGetMaxClockInfo": "sensors",
    "nvmlDeviceGetPerformanceState": "sensors",
    "nvmlDeviceGetSupportedClocksEventReasons": "sensors",
    "nvmlDeviceGetPersistenceMode": "sensors",
    "nvmlDeviceGetComputeMode": "sensors",
    "nvmlDeviceGetDisplayMode": "sensors",
    "nvmlDeviceGetDisplayActive": "sensors",
    "nvmlDeviceGetTopologyCommonAncestor": "links",
    "nvmlDeviceGetNvLinkState": "links",
    "nvmlDeviceGetNvLinkRemoteDeviceType": "links",
    "nvmlDeviceGetNvLinkRemotePciInfo_v2": "links",
    "nvmlEventSetCreate": "events",
    "nvmlDeviceGetSupportedEventTypes": "events",
    "nvmlDeviceRegisterEvents": "events",
    "nvmlEventSetWait_v2": "events",
    "nvmlEventSetFree": "events",
    "nvmlDeviceGetDriverModel": "sensors",
    "nvmlDeviceGetHandleByUUID": "handles",
    "nvmlDeviceGetHandleByPciBusId_v2": "handles",
    "nvmlDeviceGetDeviceHandleFromMigDeviceHandle": "handles",
    "nvmlDeviceIsMigDeviceHandle": "handles",
    "nvmlSystemGetProcessName": "procinfo",
    "nvmlDeviceGetProcessUtilization": "procinfo",
    "nvmlDeviceGetPowerManagementMode": "sensors",
    "nvmlDeviceGetBrand": "board",
    "nvmlDeviceGetArchitecture": "board",
    "nvmlDeviceGetVirtualizationMode": "board",
    "nvmlDeviceGetBoardId": "board",
    "nvmlDeviceGetMultiGpuBoard": "board",
    "nvmlDeviceGetVbiosVersion": "board",
    "nvmlDeviceGetInforomImageVersion": "board",
    "nvmlDeviceGetInforomVersion": "board",
    "nvmlDeviceGetBridgeChipInfo": "board",
    "nvmlDeviceGetGpuOperationMode": "board",
    "nvmlDeviceGetAccountingMode": "board",
    "nvmlDeviceGetAccountingBufferSize": "board",
    "nvmlDeviceGetAccountingPids": "board",
    "nvmlDeviceGetAccountingStats": "board",
    "nvmlDeviceSetAccountingMode": "board",
    "nvmlDeviceClearAccountingPids": "board",
    "nvmlDeviceGetCurrPcieLinkGeneration": "pcie",
    "nvmlDeviceGetCurrPcieLinkWidth": "pcie",
    "nvmlDeviceGetMaxPcieLinkGeneration": "pcie",
    "nvmlDeviceGetGpuMaxPcieLinkGeneration": "pcie",
    "nvmlDeviceGetMaxPcieLinkWidth": "pcie",
    "nvmlDeviceGetPcieThroughput": "pcie",
    "nvmlDeviceGetSupportedMemoryClocks": "clocks",
    "nvmlDeviceGetSupportedGraphicsClocks": "clocks",
    "nvmlDeviceGetApplicationsClock": "clocks",
    "nvmlDeviceGetDefaultApplicationsClock": "clocks",
    "nvmlDeviceGetAutoBoostedClocksEnabled": "clocks",
    "nvmlDeviceGetMaxCustomerBoostClock": "clocks",
    "nvmlGpmQueryDeviceSupport": "gpm",
    "nvmlGpmSampleAlloc": "gpm",
    "nvmlGpmSampleFree": "gpm",
    "nvmlGpmSampleGet": "gpm",
    "nvmlGpmMigSampleGet": "gpm",
    "nvmlGpmMetricsGet": "gpm",
    "nvmlDeviceGetMemoryErrorCounter": "ecc",
    "nvmlDeviceGetRetiredPages": "ecc",
    "nvmlDeviceGetFieldValues": "fields",
}
