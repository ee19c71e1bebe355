"""What the fake library answers through `nvmlDeviceGetFieldValues`.

Monitors ask for a few figures only as field values: nvitop the NVLink count and
per-link data counters, an exporter the memory temperature (dcgm-exporter's
DCGM_FI_DEV_MEMORY_TEMP). `library.FakeLibrary` loads this module when the function
is first looked up. As in the driver, the call succeeds and each field carries its
own return code: the fields below are answered, every other one says
NVML_ERROR_NOT_SUPPORTED in its entry.
"""

from __future__ import annotations

import time

from gpuwarden.sim import cards
from gpuwarden.sim.abi import NOT_SUPPORTED, SUCCESS, obj, val
from gpuwarden.sim.links import link_traffic

TYPE_CHECKING = False  # typing stays off the start-up path; annotations need it only here
if TYPE_CHECKING:
    from typing import Any, Optional

MEMORY_TEMP, NVLINK_LINK_COUNT = 82, 91  # NVML_FI_DEV_*
NVLINK_DATA_TX, NVLINK_DATA_RX = 138, 139  # per link (scopeId), KiB since the driver loaded
UNSIGNED_INT, UNSIGNED_LONG_LONG = 1, 3  # nvmlValueType_t
HBM_OVER_CORE = 3  # degrees C the HBM stacks run above the GPU's own sensor


def _value(state: dict[str, Any], gpu: dict[str, Any], field: int, scope: int) -> Optional[int]:
    """The field's value, or None where the card has no such figure."""
    if field == MEMORY_TEMP:
        return gpu["temperature"] + HBM_OVER_CORE if cards.figures(gpu)["hbm"] else None
    links, per_link = link_traffic(state, gpu)
    if field == NVLINK_LINK_COUNT:
        return gpu["nvlinks"] if state.get("nvswitch") else 0
    if field in (NVLINK_DATA_TX, NVLINK_DATA_RX) and 0 <= scope < links:
        # A counter that only grows: the rate over CLOCK_MONOTONIC, shared by every process.
        return int(per_link * time.monotonic() / 1024)
    return None


class Fields:
    """NVML's field-value function, as a method of `FakeLibrary`."""

    def nvmlDeviceGetFieldValues(
        self, state: Any, gpu: Any, mig: Any, count: Any, ref: Any
    ) -> None:
        entries = obj(ref)
        now = int(time.time() * 1e6)
        for i in range(val(count)):
            entry = entries[i]
            value = _value(state, gpu, entry.fieldId, entry.scopeId)
            entry.timestamp, entry.latencyUsec = now, 0
            if value is None:
                entry.nvmlReturn = NOT_SUPPORTED
                continue
            entry.nvmlReturn = SUCCESS
            if entry.fieldId in (NVLINK_DATA_TX, NVLINK_DATA_RX):
                entry.valueType, entry.value.ullVal = UNSIGNED_LONG_LONG, value
            else:
                entry.valueType, entry.value.uiVal = UNSIGNED_INT, value
