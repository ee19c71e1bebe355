"""What the fake library answers about a GPU's PCIe link: its generation, width and traffic.

Monitors show these (nvitop and nvisel ask for throughput, pynvml_utils for the
link); choosing a GPU never does, so `library.FakeLibrary` loads this module when
one of its functions is first looked up. The traffic model here also gives GPM its
PCIe figures (`gpm`).

The link: the card's generation and lane count (`cards.CARDS`); in P8 (idle, no
persistence on a workstation card) the link trains down to generation 1 to save
power, as real ones do, and is back at full speed in P0.
"""

from __future__ import annotations

from gpuwarden.sim import cards
from gpuwarden.sim.abi import INVALID_ARGUMENT, SUCCESS, put, val
from gpuwarden.sim.sensors import performance_state
from gpuwarden.sim.state import utilization

TYPE_CHECKING = False  # typing stays off the start-up path; annotations need it only here
if TYPE_CHECKING:
    from typing import Any

# Usable bytes per second of one lane, by PCIe generation (after line encoding).
LANE_BYTES = {1: 250_000_000, 2: 500_000_000, 3: 984_600_000, 4: 1_969_200_000, 5: 3_938_400_000}
# The share of the link a busy training job keeps moving: batches in, results out.
RX_SHARE, TX_SHARE = 0.04, 0.015
TX_BYTES, RX_BYTES = 0, 1  # nvmlPcieUtilCounter_t


def link(state: dict[str, Any], gpu: dict[str, Any]) -> tuple[int, int]:
    """(generation, width) the link runs at now."""
    generation, width = cards.figures(gpu)["pcie"]
    return (generation if performance_state(state, gpu) == 0 else 1), width


def traffic(state: dict[str, Any], gpu: dict[str, Any]) -> tuple[int, int]:
    """(transmitted, received) bytes per second over PCIe, following the GPU's load."""
    generation, width = link(state, gpu)
    capacity = LANE_BYTES[generation] * width
    load = utilization(state, gpu) / 100
    return int(capacity * TX_SHARE * load), int(capacity * RX_SHARE * load)


class Pcie:
    """NVML's PCIe link functions, as methods of `FakeLibrary`."""

    def nvmlDeviceGetCurrPcieLinkGeneration(self, state: Any, gpu: Any, mig: Any, out: Any) -> None:
        put(out, link(state, gpu)[0])

    def nvmlDeviceGetCurrPcieLinkWidth(self, state: Any, gpu: Any, mig: Any, out: Any) -> None:
        put(out, link(state, gpu)[1])

    def nvmlDeviceGetMaxPcieLinkGeneration(self, state: Any, gpu: Any, mig: Any, out: Any) -> None:
        put(out, cards.figures(gpu)["pcie"][0])  # every slot here matches its card

    def nvmlDeviceGetGpuMaxPcieLinkGeneration(
        self, state: Any, gpu: Any, mig: Any, out: Any
    ) -> None:
        put(out, cards.figures(gpu)["pcie"][0])

    def nvmlDeviceGetMaxPcieLinkWidth(self, state: Any, gpu: Any, mig: Any, out: Any) -> None:
        put(out, cards.figures(gpu)["pcie"][1])

    def nvmlDeviceGetPcieThroughput(
        self, state: Any, gpu: Any, mig: Any, counter: Any, out: Any
    ) -> int:
        kind = val(counter)
        if kind not in (TX_BYTES, RX_BYTES):
            return INVALID_ARGUMENT
        put(out, traffic(state, gpu)[kind] // 1024)  # KB/s, as NVML counts
        return SUCCESS
