"""What the fake library answers about the board: brand, architecture, firmware, board
id, virtualization and accounting.

nvidia-smi's header of each GPU, and what NVIDIA's nvidia-ml-py example and
pynvml_utils print; gpuwarden never asks, so `library.FakeLibrary` loads this module
when one of its functions is first looked up. Figures come from the card's entry in
`cards.CARDS`; every simulated machine is bare metal, with accounting off (the
driver's default).
"""

from __future__ import annotations

from gpuwarden.sim import cards
from gpuwarden.sim.abi import (
    INSUFFICIENT_SIZE,
    INVALID_ARGUMENT,
    NOT_SUPPORTED,
    SUCCESS,
    bus_key,
    put,
    val,
)

TYPE_CHECKING = False  # typing stays off the start-up path; annotations need it only here
if TYPE_CHECKING:
    from typing import Any

# nvmlDeviceArchitecture_t by compute capability (8.6 is Ampere too, 8.9 Ada).
ARCHITECTURES = {(7, 0): 5, (7, 5): 6, (8, 0): 7, (8, 6): 7, (8, 9): 8, (9, 0): 9, (10, 0): 10}
HOPPER = 9
VIRTUALIZATION_NONE = 0  # bare metal
INFOROM_OEM, INFOROM_ECC = 0, 1  # nvmlInforomObject_t; the power object is N/A on these cards
ACCOUNTING_BUFFER = 4000  # processes the driver keeps accounting records for


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
        put(out, 0)

    def nvmlDeviceGetAccountingBufferSize(self, state: Any, gpu: Any, mig: Any, out: Any) -> None:
        put(out, ACCOUNTING_BUFFER)

    def nvmlDeviceGetAccountingPids(
        self, state: Any, gpu: Any, mig: Any, count: Any, array: Any
    ) -> int:
        return NOT_SUPPORTED  # what the driver says while accounting mode is disabled

    def nvmlDeviceGetAccountingStats(
        self, state: Any, gpu: Any, mig: Any, pid: Any, ref: Any
    ) -> int:
        return NOT_SUPPORTED
