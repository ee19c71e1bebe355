"""What the fake library answers about the clocks a card can run at.

The supported memory and graphics clocks, applications clocks and boost settings:
what `nvidia-smi -q -d SUPPORTED_CLOCKS`, pynvml_utils' query and other monitors
show, and nothing in gpuwarden asks. So `library.FakeLibrary` loads this module when
one of its functions is first looked up. Figures come from the card's entry in
`cards.CARDS`; current clocks are in `sensors`.
"""

from __future__ import annotations

from gpuwarden.sim import cards
from gpuwarden.sim.abi import (
    INSUFFICIENT_SIZE,
    INVALID_ARGUMENT,
    NOT_FOUND,
    NOT_SUPPORTED,
    SUCCESS,
    obj,
    put,
    val,
)

TYPE_CHECKING = False  # typing stays off the start-up path; annotations need it only here
if TYPE_CHECKING:
    from collections.abc import Sequence
    from typing import Any

GRAPHICS, SM, MEM, VIDEO = 0, 1, 2, 3  # nvmlClockType_t
LOWEST_GRAPHICS = 210  # MHz: the bottom of every card's graphics clock table here
IDLE_MEMORY_GRAPHICS = 645  # MHz: the highest graphics clock a GDDR card pairs with idle memory


def supported_graphics(gpu: dict[str, Any], memory: int) -> list[int]:
    """The graphics clocks (MHz, fastest first) the card runs with memory at `memory` MHz,
    in the driver's 15 MHz steps; an idle memory clock (405, 810 MHz on GDDR cards) caps
    them low. Empty for a memory clock the card does not have."""
    memory_clocks = cards.figures(gpu)["memory_clocks"]
    if memory not in memory_clocks:
        return []
    top = gpu["clock_sm_max"]
    if memory != memory_clocks[0] and memory <= 810:
        top = IDLE_MEMORY_GRAPHICS
    return list(range(top, LOWEST_GRAPHICS - 1, -15))


def _put_list(values: Sequence[int], count_ref: Any, array: Any) -> int:
    """NVML's two-call list protocol: the count when the array is missing or too small."""
    count = obj(count_ref)
    if array is None or count.value < len(values):
        count.value = len(values)
        return INSUFFICIENT_SIZE if values else SUCCESS
    for i, value in enumerate(values):
        array[i] = value
    count.value = len(values)
    return SUCCESS


def _applications(gpu: dict[str, Any], kind: Any, out: Any) -> int:
    clocks = cards.figures(gpu)["app_clocks"]
    if clocks is None:
        return NOT_SUPPORTED
    graphics, memory = clocks
    value = {GRAPHICS: graphics, SM: graphics, MEM: memory}.get(val(kind))
    if value is None:
        return INVALID_ARGUMENT
    put(out, value)
    return SUCCESS


class Clocks:
    """NVML's clock-table functions, as methods of `FakeLibrary`."""

    def nvmlDeviceGetSupportedMemoryClocks(
        self, state: Any, gpu: Any, mig: Any, count: Any, array: Any
    ) -> int:
        return _put_list(cards.figures(gpu)["memory_clocks"], count, array)

    def nvmlDeviceGetSupportedGraphicsClocks(
        self, state: Any, gpu: Any, mig: Any, memory: Any, count: Any, array: Any
    ) -> int:
        clocks = supported_graphics(gpu, val(memory))
        if not clocks:
            return NOT_FOUND  # not one of the card's memory clocks
        return _put_list(clocks, count, array)

    def nvmlDeviceGetApplicationsClock(
        self, state: Any, gpu: Any, mig: Any, kind: Any, out: Any
    ) -> int:
        return _applications(gpu, kind, out)  # nobody here changes them: the defaults

    def nvmlDeviceGetDefaultApplicationsClock(
        self, state: Any, gpu: Any, mig: Any, kind: Any, out: Any
    ) -> int:
        return _applications(gpu, kind, out)

    def nvmlDeviceGetAutoBoostedClocksEnabled(
        self, state: Any, gpu: Any, mig: Any, enabled: Any, default: Any
    ) -> int:
        return NOT_SUPPORTED  # Volta and later: boost is not switchable (nvidia-smi: N/A)

    def nvmlDeviceGetMaxCustomerBoostClock(
        self, state: Any, gpu: Any, mig: Any, kind: Any, out: Any
    ) -> int:
        if cards.figures(gpu)["app_clocks"] is None:
            return NOT_SUPPORTED  # GeForce
        if val(kind) not in (GRAPHICS, SM, MEM):
            return INVALID_ARGUMENT
        put(out, gpu["clock_mem_max"] if val(kind) == MEM else gpu["clock_sm_max"])
        return SUCCESS
