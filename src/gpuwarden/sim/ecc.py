"""What the fake library answers about ECC errors by memory location and retired pages.

The totals and row remapping that the health watch reads are in `library`; these
finer views are what `nvidia-smi -q -d ECC,PAGE_RETIREMENT` and pynvml_utils
show, so `library.FakeLibrary` loads this module when one of its functions is first
looked up. Every error of a simulated GPU is in its device memory (DRAM/HBM), where
the spec's and `sim inject ecc`'s counts go; the on-chip locations read 0 where the
generation has them and NotSupported where it does not.
"""

from __future__ import annotations

from gpuwarden.sim import cards
from gpuwarden.sim.abi import (
    INSUFFICIENT_SIZE,
    INVALID_ARGUMENT,
    NOT_SUPPORTED,
    SUCCESS,
    lacks,
    obj,
    put,
    val,
)
from gpuwarden.sim.board import architecture

TYPE_CHECKING = False  # typing stays off the start-up path; annotations need it only here
if TYPE_CHECKING:
    from typing import Any

L1, L2, DEVICE_MEMORY, REGISTER_FILE, TEXTURE, TEXTURE_SHM, CBU, SRAM = range(8)
VOLTA, AMPERE = 5, 7  # nvmlDeviceArchitecture_t
UNCORRECTED = 1  # nvmlMemoryErrorType_t: 0 corrected, 1 uncorrected
DOUBLE_BIT = 1  # nvmlPageRetirementCause_t: 0 multiple single-bit errors, 1 double-bit error
PAGE = 0x1000


def _location_exists(gpu: dict[str, Any], location: int) -> bool:
    """Whether the generation keeps a separate ECC counter for `location`: texture memory
    until Turing, the CBU on Volta only, SRAM from Ampere on."""
    arch = architecture(gpu)
    if location in (TEXTURE, TEXTURE_SHM):
        return arch < AMPERE
    if location == CBU:
        return arch == VOLTA
    if location == SRAM:
        return arch >= AMPERE
    return location in (L1, L2, DEVICE_MEMORY, REGISTER_FILE)


class Ecc:
    """NVML's per-location ECC and page retirement functions, as methods of `FakeLibrary`."""

    def nvmlDeviceGetMemoryErrorCounter(
        self, state: Any, gpu: Any, mig: Any, kind: Any, counter: Any, location: Any, out: Any
    ) -> int:
        if lacks(gpu, cards.ECC) or not gpu["ecc"]:
            return NOT_SUPPORTED
        where = val(location)
        if not 0 <= where <= SRAM:
            return INVALID_ARGUMENT
        if not _location_exists(gpu, where):
            return NOT_SUPPORTED
        errors = gpu["ecc_uncorrected"] if val(kind) == UNCORRECTED else gpu["ecc_corrected"]
        put(out, errors if where == DEVICE_MEMORY else 0)
        return SUCCESS

    def nvmlDeviceGetRetiredPages(
        self, state: Any, gpu: Any, mig: Any, cause: Any, count_ref: Any, array: Any
    ) -> int:
        if lacks(gpu, cards.RETIRE):
            return NOT_SUPPORTED
        # A page with a double-bit error is retired (pending until the next reboot).
        pages = gpu["ecc_uncorrected"] if val(cause) == DOUBLE_BIT else 0
        count = obj(count_ref)
        if array is None or count.value < pages:
            count.value = pages
            return INSUFFICIENT_SIZE if pages else SUCCESS
        for i in range(pages):
            array[i] = 0x7F00000 + PAGE * (gpu["index"] * 64 + i)
        count.value = pages
        return SUCCESS
