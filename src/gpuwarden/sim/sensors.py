"""What the fake library answers about a GPU's sensors, clocks and modes.

Temperatures, power and energy, fans, clocks and performance state, persistence,
compute and display modes, encoder/decoder load and BAR1 memory: what `status`,
the exporter and the health watch show, and no choice of a GPU depends on. So
`library.FakeLibrary` loads this module only when one of these functions is first
looked up, and `gpuwarden run` never imports it. The methods run bound to the
`FakeLibrary`, behind its `_guarded` checks (initialised, handle valid, GPU not lost).
"""

from __future__ import annotations

import time

from gpuwarden.sim import cards
from gpuwarden.sim.abi import (
    INVALID_ARGUMENT,
    NOT_SUPPORTED,
    SUCCESS,
    lacks,
    obj,
    put,
    val,
)
from gpuwarden.sim.specdata import COMPUTE_MODES, THROTTLE_BITS
from gpuwarden.sim.state import utilization

TYPE_CHECKING = False  # typing stays off the start-up path; annotations need it only here
if TYPE_CHECKING:
    from typing import Any, Optional


class Sensors:
    """NVML's sensor, clock and mode functions, as methods of `FakeLibrary`."""

    def nvmlDeviceGetBAR1MemoryInfo(self, state: Any, gpu: Any, mig: Any, ref: Any) -> None:
        out = obj(ref)
        total = cards.figures(gpu)["bar1"] * cards.MiB
        used = 5 * cards.MiB
        if mig is not None:
            # A MIG device maps its eighths of the memory: nvidia-smi shows 65535MiB
            # for a 3g.40gb on an A100 80GB (128 GiB aperture, 4 memory slices of 8).
            eighths = max(1, round(8 * mig["memory_total"] / gpu["memory_total"]))
            total, used = total * eighths // 8 - cards.MiB, cards.MiB
        out.bar1Total, out.bar1Used, out.bar1Free = total, used, total - used

    def nvmlDeviceGetEncoderUtilization(
        self, state: Any, gpu: Any, mig: Any, util: Any, period: Any
    ) -> None:
        put(util, 0)
        put(period, 167000)

    def nvmlDeviceGetDecoderUtilization(
        self, state: Any, gpu: Any, mig: Any, util: Any, period: Any
    ) -> None:
        put(util, 0)
        put(period, 167000)

    def nvmlDeviceGetTemperature(
        self, state: Any, gpu: Any, mig: Any, sensor: Any, out: Any
    ) -> int:
        if val(sensor) != 0:
            return INVALID_ARGUMENT
        put(out, gpu["temperature"])
        return SUCCESS

    def nvmlDeviceGetTemperatureThreshold(
        self, state: Any, gpu: Any, mig: Any, kind: Any, out: Any
    ) -> int:
        values = {0: 92, 1: 89, 2: 87, 3: 83}  # shutdown, slowdown, mem max, gpu max
        value = values.get(val(kind))
        if value is None:
            return NOT_SUPPORTED
        put(out, value)
        return SUCCESS

    def nvmlDeviceGetPowerUsage(self, state: Any, gpu: Any, mig: Any, out: Any) -> None:
        put(out, round(gpu["power"] * 1000))

    def nvmlDeviceGetEnforcedPowerLimit(self, state: Any, gpu: Any, mig: Any, out: Any) -> None:
        put(out, int(gpu["power_limit"] * 1000))

    def nvmlDeviceGetPowerManagementLimitConstraints(
        self, state: Any, gpu: Any, mig: Any, low: Any, high: Any
    ) -> None:
        put(low, int(gpu["power_limit"] * 250))
        put(high, int(gpu["power_limit"] * 1000))

    def nvmlDeviceGetTotalEnergyConsumption(self, state: Any, gpu: Any, mig: Any, out: Any) -> None:
        # CLOCK_MONOTONIC is shared by every process, so all readers agree and it only grows.
        put(out, int(gpu["energy_base"] + gpu["power"] * time.monotonic() * 1000))

    def nvmlDeviceGetNumFans(self, state: Any, gpu: Any, mig: Any, out: Any) -> int:
        if lacks(gpu, cards.FAN):
            return NOT_SUPPORTED
        put(out, 1)
        return SUCCESS

    def nvmlDeviceGetFanSpeed(self, state: Any, gpu: Any, mig: Any, out: Any) -> int:
        return _fan(gpu, out)

    def nvmlDeviceGetFanSpeed_v2(self, state: Any, gpu: Any, mig: Any, fan: Any, out: Any) -> int:
        if val(fan) != 0:
            return INVALID_ARGUMENT
        return _fan(gpu, out)

    def nvmlDeviceGetClockInfo(self, state: Any, gpu: Any, mig: Any, kind: Any, out: Any) -> int:
        return _put_clock(gpu, kind, out, maximum=False)

    def nvmlDeviceGetMaxClockInfo(self, state: Any, gpu: Any, mig: Any, kind: Any, out: Any) -> int:
        return _put_clock(gpu, kind, out, maximum=True)

    def nvmlDeviceGetPerformanceState(self, state: Any, gpu: Any, mig: Any, out: Any) -> None:
        put(out, performance_state(state, gpu))

    def nvmlDeviceGetPowerManagementMode(self, state: Any, gpu: Any, mig: Any, out: Any) -> None:
        put(out, 1)  # every card here can report and cap its power

    def nvmlDeviceGetSupportedClocksEventReasons(
        self, state: Any, gpu: Any, mig: Any, out: Any
    ) -> None:
        bits = 0
        for value in THROTTLE_BITS.values():
            bits |= value
        put(out, bits)

    def nvmlDeviceGetPersistenceMode(self, state: Any, gpu: Any, mig: Any, out: Any) -> None:
        put(out, 1 if gpu["persistence"] else 0)

    def nvmlDeviceGetComputeMode(self, state: Any, gpu: Any, mig: Any, out: Any) -> None:
        put(out, COMPUTE_MODES[gpu["compute_mode"]])

    def nvmlDeviceGetDisplayMode(self, state: Any, gpu: Any, mig: Any, out: Any) -> int:
        return _display(gpu, out)

    def nvmlDeviceGetDisplayActive(self, state: Any, gpu: Any, mig: Any, out: Any) -> int:
        return _display(gpu, out)

    def nvmlDeviceGetDriverModel(
        self, state: Any, gpu: Any, mig: Any, current: Any, pending: Any
    ) -> int:
        return NOT_SUPPORTED  # WDDM/TCC exist only on Windows


def performance_state(state: dict[str, Any], gpu: dict[str, Any]) -> int:
    """P0 or P8: data-centre cards in persistence mode stay in P0; others drop to P8 idle."""
    busy = utilization(state, gpu) > 0
    datacenter = not lacks(gpu, cards.MIG)
    return 0 if busy or (gpu["persistence"] and datacenter) else 8


def _fan(gpu: dict[str, Any], out: Any) -> int:
    if lacks(gpu, cards.FAN) or gpu.get("fan") is None:
        return NOT_SUPPORTED
    put(out, gpu["fan"])
    return SUCCESS


def _put_clock(gpu: Any, kind: Any, out: Any, maximum: bool) -> int:
    """The current or maximum clock of `kind` into `out`; an unknown kind is refused."""
    value = _clock(gpu, val(kind), maximum)
    if value is None:
        return INVALID_ARGUMENT
    put(out, value)
    return SUCCESS


def _clock(gpu: dict[str, Any], kind: int, maximum: bool) -> Optional[int]:
    if kind in (0, 1):  # graphics, SM
        return gpu["clock_sm_max"] if maximum else gpu["clock_sm"]
    if kind == 2:
        return gpu["clock_mem_max"]
    if kind == 3:
        return int(gpu["clock_sm_max"] * 0.9) if maximum else int(gpu["clock_sm"] * 0.9)
    return None


def _display(gpu: dict[str, Any], out: Any) -> int:
    if lacks(gpu, cards.DISPLAY):
        return NOT_SUPPORTED
    put(out, 0)
    return SUCCESS
