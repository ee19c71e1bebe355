"""Steering a simulated machine: what tests, demos and `gpuwarden sim` use to make
things happen that NVML clients in any process then see.

Apart from `sim.state` on purpose: every simulated NVML client reads the state, and
none of them needs the checks and the changes here.
"""

from __future__ import annotations

import os
import time

from gpuwarden.base.errors import UserError
from gpuwarden.base.units import is_digits
from gpuwarden.sim import specdata, specs
from gpuwarden.sim.state import StateFile, memory_used

TYPE_CHECKING = False  # typing stays off the start-up path; annotations need it only here
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any, Optional, Union

    GpuRef = Union[int, str]


# XID 79: "GPU has fallen off the bus", what the driver logs when a GPU is lost.
XID_FALLEN_OFF_BUS = 79
_SETTABLE = {
    "temperature": int,
    "utilization": int,
    "memory_utilization": int,
    "memory_used": int,
    "power": float,
    "fan": int,
    "clock_sm": int,
    "persistence": bool,
    "compute_mode": str,
    "pcie_replay": int,
    "lost": bool,
}


# What each settable number may be: what NVML can report on a working card. NVML
# hands temperatures and percentages back as unsigned integers, so a negative value
# would come out as 4294966796C; it is refused here instead.
RANGES: dict[str, tuple[float, float]] = {
    "temperature": (0, 150),  # degrees C; drivers shut a card down well below 150
    "utilization": (0, 100),
    "memory_utilization": (0, 100),
    "fan": (0, 100),  # percent of the fan's top speed
    "power": (0, 5000),  # watts; also capped by the card's limit below
    "clock_sm": (0, 10000),  # MHz
    "pcie_replay": (0, 2**32 - 1),
    "memory_used": (0, 2**60),  # bytes; also capped by the card's memory below
}


def check_value(key: str, value: Any, gpu: Optional[dict[str, Any]] = None) -> None:
    """Raise UserError, in one line naming the field and its range, for a value the
    simulated card could not report."""
    low, high = RANGES.get(key, (None, None))
    if low is None or high is None:
        return
    if gpu is not None and key == "memory_used":
        high = gpu["memory_total"]
    if gpu is not None and key == "power":
        high = 2 * float(gpu["power_limit"])  # transients overshoot the limit, not twofold
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    if number and low <= value <= high:  # also refuses NaN
        return
    if key == "memory_used":
        from gpuwarden.base.units import format_size

        span = f"0 to {format_size(int(high))}"
    else:
        span = f"{low:g} to {high:g}"
    where = f" on GPU {gpu['index']}" if gpu is not None else ""
    raise UserError(f"{key} must be {span}{where}, got {value!r}")


def find_gpu(state: dict[str, Any], ref: GpuRef) -> dict[str, Any]:
    """A GPU by NVML index or UUID (a unique UUID prefix is enough)."""
    gpus = state["gpus"]
    text = str(ref).strip()
    if is_digits(text):
        i = int(text)
        if i < len(gpus):
            return gpus[i]
        raise UserError(f"no GPU {i} on simulated machine {state['spec']} (it has {len(gpus)})")
    hits = [g for g in gpus if g["uuid"].startswith(text)]
    if len(hits) == 1:
        return hits[0]
    raise UserError(f"no GPU {text!r} on simulated machine {state['spec']} (give an index or UUID)")


class Machine:
    """Steer a simulated machine: what tests, demos and `gpuwarden sim` use to make
    things happen that NVML clients in any process then see."""

    def __init__(self, spec: specs.Spec, state_dir: Optional[str] = None) -> None:
        self.spec = spec
        self.file = StateFile(spec, state_dir)

    @classmethod
    def open(cls, spec: Optional[str] = None, state_dir: Optional[str] = None) -> Machine:
        name = spec or os.environ.get("GPUWARDEN_SIM")
        if not name:
            raise UserError("no simulated machine: give a spec name or set GPUWARDEN_SIM")
        return cls(specs.load(name, state_dir), state_dir)

    @property
    def name(self) -> str:
        return self.spec.name

    def state(self) -> dict[str, Any]:
        return self.file.read()

    def _gpu_change(
        self, gpu: GpuRef, change: Callable[[dict[str, Any], dict[str, Any]], Any]
    ) -> Any:
        return self.file.update(lambda state: change(state, find_gpu(state, gpu)))

    def add_process(
        self,
        gpu: GpuRef,
        pid: int,
        memory: Union[int, str],
        user: Optional[str] = None,
        command: Optional[str] = None,
        *,
        util: int = 0,
        kind: str = "compute",
        mig: Optional[int] = None,
    ) -> None:
        """Register `pid` as holding `memory` on `gpu`; refused, like a CUDA allocation,
        when the GPU has less free memory than that."""
        size = specdata.size(memory)

        def change(state: dict[str, Any], g: dict[str, Any]) -> None:
            if g.get("lost"):
                raise UserError(f"GPU {g['index']} is lost")
            state["processes"] = [
                p for p in state["processes"] if not (p["pid"] == pid and p["gpu"] == g["uuid"])
            ]
            free = g["memory_total"] - g["memory_reserved"] - memory_used(state, g)
            if size > free:
                from gpuwarden.base.units import format_size

                raise UserError(
                    f"GPU {g['index']} has {format_size(free)} free; "
                    f"cannot hold {format_size(size)}"
                )
            state["processes"].append(
                {
                    "pid": int(pid),
                    "gpu": g["uuid"],
                    "memory": size,
                    "user": user,
                    "command": command,
                    "kind": kind,
                    "mig": mig,
                    "util": int(util),
                    "synthetic": False,
                    "added": time.time(),  # accounting records it from here (sim.accounting)
                }
            )

        self._gpu_change(gpu, change)

    def remove_process(self, pid: int) -> None:
        def change(state: dict[str, Any]) -> None:
            state["processes"] = [p for p in state["processes"] if p["pid"] != pid]

        self.file.update(change)

    def set_gpu(self, gpu: GpuRef, **fields: Any) -> None:
        for key in fields:
            if key not in _SETTABLE:
                raise UserError(f"cannot set {key!r}; settable: {', '.join(sorted(_SETTABLE))}")
            if key == "compute_mode" and fields[key] not in specdata.COMPUTE_MODES:
                raise UserError(f"compute_mode must be one of {', '.join(specdata.COMPUTE_MODES)}")

        for key, value in fields.items():
            check_value(key, value)

        def change(state: dict[str, Any], g: dict[str, Any]) -> None:
            for key, value in fields.items():
                check_value(key, value, g)
                if key == "fan" and g.get("fan") is None:
                    raise UserError(
                        f"GPU {g['index']} ({g['name']}) has no fan: NVML reports NotSupported"
                    )
            for key, value in fields.items():
                g[key] = _SETTABLE[key](value)

        self._gpu_change(gpu, change)

    def _event(self, state: dict[str, Any], g: dict[str, Any], xid: int) -> None:
        state["seq"] = state.get("seq", 0) + 1
        state["events"].append(
            {"seq": state["seq"], "gpu": g["uuid"], "xid": int(xid), "at": time.time()}
        )
        del state["events"][:-1000]

    def inject_xid(self, gpu: GpuRef, xid: int) -> None:
        """An XID error, delivered to every nvmlEventSetWait registered for the GPU."""
        self._gpu_change(gpu, lambda state, g: self._event(state, g, xid))

    def lose(self, gpu: GpuRef) -> None:
        """The GPU falls off the bus: XID 79, then GpuIsLost on its handle."""

        def change(state: dict[str, Any], g: dict[str, Any]) -> None:
            g["lost"] = True
            self._event(state, g, XID_FALLEN_OFF_BUS)

        self._gpu_change(gpu, change)

    def _require(self, g: dict[str, Any], feature: str) -> None:
        if feature in g["unsupported"]:
            raise UserError(f"GPU {g['index']} ({g['name']}) does not support {feature}")

    def set_ecc(
        self, gpu: GpuRef, uncorrected: Optional[int] = None, corrected: Optional[int] = None
    ) -> None:
        def change(state: dict[str, Any], g: dict[str, Any]) -> None:
            self._require(g, "ecc")
            if uncorrected is not None:
                g["ecc_uncorrected"] = int(uncorrected)
            if corrected is not None:
                g["ecc_corrected"] = int(corrected)

        self._gpu_change(gpu, change)

    def set_remapped_rows(
        self, gpu: GpuRef, pending: Optional[bool] = None, failure: Optional[bool] = None
    ) -> None:
        def change(state: dict[str, Any], g: dict[str, Any]) -> None:
            self._require(g, "remapped_rows")
            if pending is not None:
                g["remapped_rows_pending"] = bool(pending)
            if failure is not None:
                g["remapped_rows_failure"] = bool(failure)

        self._gpu_change(gpu, change)

    def set_throttle(self, gpu: GpuRef, reasons: Union[str, list[str], tuple[str, ...]]) -> None:
        names = [r for r in (reasons.split(",") if isinstance(reasons, str) else reasons) if r]
        for reason in names:
            if reason not in specdata.THROTTLE_BITS:
                known = ", ".join(specdata.THROTTLE_BITS)
                raise UserError(f"unknown throttle reason {reason!r}; known: {known}")

        def change(state: dict[str, Any], g: dict[str, Any]) -> None:
            g["throttle"] = list(names)

        self._gpu_change(gpu, change)

    def reset(self) -> None:
        """Back to the spec's initial state."""
        self.file.reset()
