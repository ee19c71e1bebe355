"""The parsed form of a machine spec: the `Spec` record and the tables its fields use.

Shared by `specs` (which loads a spec, from its parsed-form cache when it can),
`specparse` (which reads and validates the TOML on a cache miss), `state` and the
fake library, so none of them has to import another for these definitions.
"""

from __future__ import annotations

import marshal

from gpuwarden.base.records import field, record

TYPE_CHECKING = False  # typing stays off the start-up path; annotations need it only here
if TYPE_CHECKING:
    from typing import Any

THROTTLE_BITS = {
    "gpu_idle": 0x1,
    "applications_clocks_setting": 0x2,
    "sw_power_cap": 0x4,
    "hw_slowdown": 0x8,
    "sync_boost": 0x10,
    "sw_thermal": 0x20,
    "hw_thermal": 0x40,
    "hw_power_brake": 0x80,
    "display_clocks_setting": 0x100,
}
COMPUTE_MODES = {"Default": 0, "Exclusive_Thread": 1, "Prohibited": 2, "Exclusive_Process": 3}


@record
class Spec:
    """A parsed, validated spec; `initial_state()` is the machine before anything happens."""

    name: str
    path: str
    driver: bool = True
    driver_version: str = "550.54.15"
    cuda_version: int = 12040  # NVML's encoding: 1000 * major + 10 * minor
    description: str = ""
    nvswitch: bool = False
    gpus: tuple[dict[str, Any], ...] = ()
    processes: tuple[dict[str, Any], ...] = field(default=())

    def initial_state(self) -> dict[str, Any]:
        # A deep copy by marshal: the spec's data is plain (dicts, lists, strings,
        # numbers), and every client of a machine that has no state file yet makes
        # this copy, ~10x faster than copy.deepcopy and with no import.
        gpus, processes = marshal.loads(marshal.dumps((list(self.gpus), list(self.processes))))
        return {
            "spec": self.name,
            "spec_path": self.path,
            "driver": self.driver,
            "driver_version": self.driver_version,
            "cuda_version": self.cuda_version,
            "nvswitch": self.nvswitch,
            "gpus": gpus,
            "processes": processes,
            "events": [],
            "seq": 0,
        }


def size(value: Any) -> int:
    """A memory size: bytes as a number, or text such as "40GiB" (`units.parse_size`)."""
    if isinstance(value, int):
        return value
    from gpuwarden.base.units import parse_size

    return parse_size(str(value))
