"""What the fake library answers about the board: brand, architecture, firmware, board
id, virtualization and accounting.

nvidia-smi's header of each GPU, and what NVIDIA's nvidia-ml-py example and
pynvml_utils print; gpuwarden never asks, so `library.FakeLibrary` loads this module
when one of its functions is first looked up. Figures come from the card's entry in
`cards.CARDS`; every simulated machine is bare metal, with accounting off (the
driver's default) until root turns it on (sim.accounting keeps the records).
"""

from __future__ import annotations

import os
import time

from gpuwarden.sim import accounting, cards
from gpuwarden.sim.abi import (
    INSUFFICIENT_SIZE,
    INVALID_ARGUMENT,
    NO_PERMISSION,
    NOT_FOUND,
    NOT_SUPPORTED,
    SUCCESS,
    bus_key,
    obj,
    put,
    val,
)
from gpuwarden.sim.state import pid_alive

TYPE_CHECKING = False  # typing stays off the start-up path; annotations need it only here
if TYPE_CHECKING:
    from typing import Any

    from gpuwarden.sim.state import StateFile

# nvmlDeviceArchitecture_t by compute capability (8.6 is Ampere too, 8.9 Ada).
ARCHITECTURES = {(7, 0): 5, (7, 5): 6, (8, 0): 7, (8, 6): 7, (8, 9): 8, (9, 0): 9, (10, 0): 10}
HOPPER = 9
VIRTUALIZATION_NONE = 0  # bare metal
INFOROM_OEM, INFOROM_ECC = 0, 1  # nvmlInforomObject_t; the power object is N/A on these cards


def architecture(gpu: dict[str, Any]) -> int:
    """The card's nvmlDeviceArchitecture_t (Volta 5 ... Hopper 9, Blackwell 10)."""
    major, minor = gpu["compute_capability"]
    return ARCHITECTURES.get((major, minor), ARCHITECTURES.get((major, 0), 0xFFFFFFFF))


def _text(buf: Any, size: Any, value: str) -> int:
    data = value.encode()
    if len(data) >= val(size):
        return INSUFFICIENT_SIZE
    buf.value = data
    return SUCCESS


class Board:
    """NVML's board and firmware functions, as methods of `FakeLibrary`."""

    file: StateFile

    def nvmlDeviceGetBrand(self, state: Any, gpu: Any, mig: Any, out: Any) -> None:
        put(out, cards.figures(gpu)["brand"])

    def nvmlDeviceGetArchitecture(self, state: Any, gpu: Any, mig: Any, out: Any) -> None:
        put(out, architecture(gpu))

    def nvmlDeviceGetVirtualizationMode(self, state: Any, gpu: Any, mig: Any, out: Any) -> None:
        put(out, VIRTUALIZATION_NONE)

    def nvmlDeviceGetBoardId(self, state: Any, gpu: Any, mig: Any, out: Any) -> None:
        # Unique per board; drivers derive it from the PCI location (bus 07 -> 0x700).
        domain, bus, device, _ = bus_key(gpu["pci_bus_id"])
        put(out, (domain << 16) | (bus << 8) | (device << 3))

    def nvmlDeviceGetMultiGpuBoard(self, state: Any, gpu: Any, mig: Any, out: Any) -> None:
        put(out, 0)  # one GPU per board on every card here (no K80-style dual boards)

    def nvmlDeviceGetVbiosVersion(self, state: Any, gpu: Any, mig: Any, buf: Any, size: Any) -> int:
        return _text(buf, size, cards.figures(gpu)["vbios"])

    def nvmlDeviceGetInforomImageVersion(
        self, state: Any, gpu: Any, mig: Any, buf: Any, size: Any
    ) -> int:
        return _text(buf, size, cards.figures(gpu)["inforom"][0])

    def nvmlDeviceGetInforomVersion(
        self, state: Any, gpu: Any, mig: Any, which: Any, buf: Any, size: Any
    ) -> int:
        kind = val(which)
        if kind == INFOROM_OEM:
            return _text(buf, size, "2.0")
        ecc = cards.figures(gpu)["inforom"][1]
        if kind == INFOROM_ECC and ecc is not None:
            return _text(buf, size, ecc)
        return NOT_SUPPORTED if kind in (INFOROM_ECC, 2, 3) else INVALID_ARGUMENT

    def nvmlDeviceGetBridgeChipInfo(self, state: Any, gpu: Any, mig: Any, ref: Any) -> int:
        return NOT_SUPPORTED  # no PCIe bridge chip on these boards (nvidia-smi: N/A)

    def nvmlDeviceGetGpuOperationMode(
        self, state: Any, gpu: Any, mig: Any, current: Any, pending: Any
    ) -> int:
        return NOT_SUPPORTED  # GOM exists on Kepler-era Tesla/Titan boards only

    def nvmlDeviceGetAccountingMode(self, state: Any, gpu: Any, mig: Any, out: Any) -> None:
        put(out, int(accounting.records(state, gpu["uuid"]) is not None))

    def nvmlDeviceSetAccountingMode(self, state: Any, gpu: Any, mig: Any, mode: Any) -> int:
        if os.geteuid() != 0:
            return NO_PERMISSION  # root's alone, as the driver's
        on, uuid = bool(val(mode)), gpu["uuid"]
        self.file.update(lambda s: accounting.set_mode(s, uuid, on, time.time()))
        return SUCCESS

    def nvmlDeviceClearAccountingPids(self, state: Any, gpu: Any, mig: Any) -> int:
        if os.geteuid() != 0:
            return NO_PERMISSION
        uuid = gpu["uuid"]
        self.file.update(lambda s: accounting.clear(s, uuid))
        return SUCCESS

    def nvmlDeviceGetAccountingBufferSize(self, state: Any, gpu: Any, mig: Any, out: Any) -> None:
        put(out, accounting.BUFFER)

    def nvmlDeviceGetAccountingPids(
        self, state: Any, gpu: Any, mig: Any, count: Any, array: Any
    ) -> int:
        kept = accounting.records(state, gpu["uuid"])
        if kept is None:
            return NOT_SUPPORTED  # what the driver says while accounting mode is disabled
        pids = list(dict.fromkeys(r["pid"] for r in kept))
        room = obj(count)
        if array is None or room.value < len(pids):
            room.value = len(pids)
            return INSUFFICIENT_SIZE
        for i, pid in enumerate(pids):
            array[i] = pid
        room.value = len(pids)
        return SUCCESS

    def nvmlDeviceGetAccountingStats(
        self, state: Any, gpu: Any, mig: Any, pid: Any, ref: Any
    ) -> int:
        kept = accounting.records(state, gpu["uuid"])
        if kept is None:
            return NOT_SUPPORTED
        mine = [r for r in kept if r["pid"] == val(pid)]
        if not mine:
            return NOT_FOUND
        record, now = mine[-1], time.time()  # its latest run under that pid
        running = record["end"] is None and pid_alive(record["pid"])
        end = now if record["end"] is None else record["end"]
        stats = obj(ref)
        stats.gpuUtilization = record["util"]
        stats.memoryUtilization = gpu["memory_utilization"] if running else 0
        stats.maxMemoryUsage = record["memory"]
        stats.time = int(max(0.0, end - record["start"]) * 1000)  # milliseconds
        stats.startTime = int(record["start"] * 1e6)  # microseconds since the epoch
        stats.isRunning = int(running)
        return SUCCESS
