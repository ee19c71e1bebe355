"""The fake library's event sets: Xid errors as NVML delivers them.

`Machine.inject_xid` appends an event to the machine's state with a sequence
number; an event set remembers the last number it has seen, and
`nvmlEventSetWait_v2` polls the state file for newer ones until its timeout.
Only the health watch waits for events, so `library.FakeLibrary` loads this
module when one of its functions is first looked up.
"""

from __future__ import annotations

import ctypes
import time

from gpuwarden.sim.abi import (
    INVALID_ARGUMENT,
    NO_INSTANCE,
    SUCCESS,
    TIMEOUT,
    address,
    handle,
    obj,
    put,
    put_pointer,
    val,
)

TYPE_CHECKING = False  # typing stays off the start-up path; annotations need it only here
if TYPE_CHECKING:
    from typing import Any

    from gpuwarden.sim.state import StateFile

_EVENT_BASE = 0x4E5645000000  # event sets are opaque pointers too, apart from device handles
_XID_EVENT = 0x8


class Events:
    """NVML's event-set functions, as methods of `FakeLibrary` (which owns `event_sets`)."""

    nv: Any  # the pynvml copy on top, for its handle type
    file: StateFile
    event_sets: dict[int, dict[str, Any]]

    def nvmlEventSetCreate(self, out: Any) -> None:
        new = _EVENT_BASE + len(self.event_sets) + 1
        self.event_sets[new] = {"devices": {}, "seq": self.file.read().get("seq", 0)}
        put_pointer(out, new)

    def nvmlDeviceGetSupportedEventTypes(self, state: Any, gpu: Any, mig: Any, out: Any) -> None:
        put(out, _XID_EVENT | 0x1 | 0x2 | 0x4 | 0x10)

    def nvmlDeviceRegisterEvents(
        self, state: Any, gpu: Any, mig: Any, types: Any, event_set: Any
    ) -> int:
        entry = self.event_sets.get(address(event_set) or 0)
        if entry is None:
            return INVALID_ARGUMENT
        entry["devices"][gpu["uuid"]] = entry["devices"].get(gpu["uuid"], 0) | val(types)
        return SUCCESS

    def nvmlEventSetWait_v2(self, event_set: Any, ref: Any, timeout_ms: Any) -> int:
        entry = self.event_sets.get(address(event_set) or 0)
        if entry is None:
            return INVALID_ARGUMENT
        deadline = time.monotonic() + val(timeout_ms) / 1000.0
        while True:
            state = self.file.read()
            for event in state.get("events", []):
                if event["seq"] <= entry["seq"]:
                    continue
                entry["seq"] = event["seq"]
                if entry["devices"].get(event["gpu"], 0) & _XID_EVENT:
                    gpu = next(g for g in state["gpus"] if g["uuid"] == event["gpu"])
                    data = obj(ref)
                    data.device = ctypes.cast(ctypes.c_void_p(handle(gpu)), self.nv.c_nvmlDevice_t)
                    data.eventType = _XID_EVENT
                    data.eventData = event["xid"]
                    data.gpuInstanceId = NO_INSTANCE
                    data.computeInstanceId = NO_INSTANCE
                    return SUCCESS
            left = deadline - time.monotonic()
            if left <= 0:
                return TIMEOUT
            time.sleep(min(0.02, left))

    def nvmlEventSetFree(self, event_set: Any) -> int:
        if self.event_sets.pop(address(event_set) or 0, None) is None:
            return INVALID_ARGUMENT
        return SUCCESS
