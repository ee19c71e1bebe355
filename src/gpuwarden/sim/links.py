"""What the fake library answers about how GPUs connect: PCIe topology and NVLink.

Only `topology` (status's matrix, spreading a job over near GPUs when asked) reads
these; choosing a GPU by default does not, so `library.FakeLibrary` loads this
module when one of its functions is first looked up.
"""

from __future__ import annotations

from gpuwarden.sim import cards
from gpuwarden.sim.abi import INVALID_ARGUMENT, NOT_SUPPORTED, SUCCESS, lacks, obj, put, val
from gpuwarden.sim.state import utilization

TYPE_CHECKING = False  # typing stays off the start-up path; annotations need it only here
if TYPE_CHECKING:
    from typing import Any


LINK_BYTES = 25_000_000_000  # one NVLink 3 or 4 link, one direction, bytes per second
LINK_SHARE = 0.3  # of the links' capacity a busy multi-GPU job keeps moving


def link_traffic(state: dict[str, Any], gpu: dict[str, Any]) -> tuple[int, float]:
    """(active links, bytes per second each way on each): only NVSwitch machines carry
    traffic here, following the GPU's load."""
    links = gpu["nvlinks"] if state.get("nvswitch") and not lacks(gpu, cards.NVLINK) else 0
    return links, LINK_BYTES * LINK_SHARE * utilization(state, gpu) / 100


class Links:
    """NVML's topology and NVLink functions, as methods of `FakeLibrary`."""

    nv: Any  # the pynvml copy on top, for its constants

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
        put(out, level)

    def nvmlDeviceGetNvLinkState(self, state: Any, gpu: Any, mig: Any, link: Any, out: Any) -> int:
        code = _link(self.nv, gpu, link)
        if code == SUCCESS:
            put(out, 1 if state.get("nvswitch") or gpu.get("nvlink_peer") is not None else 0)
        return code

    def nvmlDeviceGetNvLinkRemoteDeviceType(
        self, state: Any, gpu: Any, mig: Any, link: Any, out: Any
    ) -> int:
        code = _link(self.nv, gpu, link)
        if code == SUCCESS:
            if state.get("nvswitch"):
                kind = self.nv.NVML_NVLINK_DEVICE_TYPE_SWITCH
            elif gpu.get("nvlink_peer") is not None:
                kind = self.nv.NVML_NVLINK_DEVICE_TYPE_GPU
            else:
                kind = self.nv.NVML_NVLINK_DEVICE_TYPE_UNKNOWN
            put(out, kind)
        return code

    def nvmlDeviceGetNvLinkRemotePciInfo_v2(
        self, state: Any, gpu: Any, mig: Any, link: Any, ref: Any
    ) -> int:
        code = _link(self.nv, gpu, link)
        if code != SUCCESS:
            return code
        info = obj(ref)
        peer = gpu.get("nvlink_peer")
        if not state.get("nvswitch"):
            if peer is None:
                return NOT_SUPPORTED
            other = state["gpus"][peer]  # a bridge: every link goes to the one peer GPU
            bus = other["pci_bus_id"]
            info.busId, info.busIdLegacy = bus.encode(), bus[4:].encode()
            info.domain, info.bus = int(bus[:8], 16), int(bus[9:11], 16)
            info.device, info.pciDeviceId = int(bus[12:14], 16), other["pci_device_id"]
            return SUCCESS
        # Six NVSwitches on the baseboard; each GPU's links fan out across them.
        switch = val(link) % 6
        bus = f"00000000:{0xC4 + switch:02X}:00.0"
        info.busId = bus.encode()
        info.busIdLegacy = bus[4:].encode()
        info.domain, info.bus, info.device = 0, 0xC4 + switch, 0
        info.pciDeviceId = 0x1AF110DE
        return SUCCESS


def _link(nv: Any, gpu: dict[str, Any], link: Any) -> int:
    i = val(link)
    if not 0 <= i < nv.NVML_NVLINK_MAX_LINKS:
        return INVALID_ARGUMENT
    if lacks(gpu, cards.NVLINK) or i >= gpu["nvlinks"]:
        return NOT_SUPPORTED
    return SUCCESS
