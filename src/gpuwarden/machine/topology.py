"""How a machine's GPUs are connected: PCIe topology levels and NVLink counts per pair.

Read only when a request needs more than one GPU (it costs n^2 NVML calls):
selection then prefers pairs that talk over NVLink or one PCIe switch. The levels
are NVML's (`gpuwarden.machine.inventory.TOPOLOGY_*`); lower is closer.
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any


def _text(value: Any) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


def read_topology(
    nv: Any, get: Callable[..., Any], handles: dict[int, Any], bus_ids: dict[int, str]
) -> tuple[dict[tuple[int, int], int], dict[tuple[int, int], int]]:
    """(pair -> topology level, pair -> NVLink count) for the GPUs of `handles` (index ->
    NVML handle); `get` calls NVML with None for what a card cannot answer."""
    topo: dict[tuple[int, int], int] = {}
    indices = sorted(handles)
    for a_pos, a in enumerate(indices):
        for b in indices[a_pos + 1 :]:
            level = get("nvmlDeviceGetTopologyCommonAncestor", handles[a], handles[b])
            if level is not None:
                topo[(a, b)] = int(level)
    # NVLink: links to another GPU join that pair; links to an NVSwitch join every pair
    # of GPUs on the switch fabric (by the smaller number of switch links of the two).
    bus_to_index = {bus.upper(): index for index, bus in bus_ids.items()}
    direct: dict[tuple[int, int], int] = {}
    switched: dict[int, int] = {}
    max_links = getattr(nv, "NVML_NVLINK_MAX_LINKS", 18)
    for i in indices:
        for link in range(max_links):
            try:
                active = nv.nvmlDeviceGetNvLinkState(handles[i], link)
            except nv.NVMLError:
                break
            if not active:
                continue
            kind = get("nvmlDeviceGetNvLinkRemoteDeviceType", handles[i], link)
            if kind == getattr(nv, "NVML_NVLINK_DEVICE_TYPE_SWITCH", 2):
                switched[i] = switched.get(i, 0) + 1
                continue
            pci = get("nvmlDeviceGetNvLinkRemotePciInfo", handles[i], link)
            other = bus_to_index.get(_text(pci.busId).upper()) if pci is not None else None
            if other is not None and other != i:
                key = (min(i, other), max(i, other))
                direct[key] = direct.get(key, 0) + 1
    links = {k: (v + 1) // 2 for k, v in direct.items()}  # each link is seen from both ends
    fabric = sorted(switched)
    for a_pos, a in enumerate(fabric):
        for b in fabric[a_pos + 1 :]:
            links[(a, b)] = min(switched[a], switched[b])
    return topo, links
