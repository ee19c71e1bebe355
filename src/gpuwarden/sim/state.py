"""The simulated machine's shared, mutable state: one JSON file, changed under flock.

Several processes look at one simulated machine at once (a long-running exporter,
a `gpuwarden run` child, a test injecting a fault), so the state lives in a file,
not in memory. Writers take an exclusive `flock`, read, change, write a temporary
file and rename it over the old one; readers never lock: a rename is atomic and
they re-read only when the file's identity (inode, mtime, size) changed, which
costs one `stat` per NVML call.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator

from gpuwarden.errors import UserError
from gpuwarden.safefiles import write_atomic
from gpuwarden.sim import specdata, specs
from gpuwarden.units import is_digits

TYPE_CHECKING = False  # typing stays off the start-up path; annotations need it only here
if TYPE_CHECKING:
    from collections.abc import Callable
    from contextlib import AbstractContextManager
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
        from gpuwarden.units import format_size

        span = f"0 to {format_size(int(high))}"
    else:
        span = f"{low:g} to {high:g}"
    where = f" on GPU {gpu['index']}" if gpu is not None else ""
    raise UserError(f"{key} must be {span}{where}, got {value!r}")


# A state file bigger than this is not one the simulator wrote (8 GPUs: ~10 KiB).
MAX_STATE = 16 * 1024 * 1024
#: Seconds a writer waits for the state's lock before it gives up with one line.
LOCK_PATIENCE = 10.0


def _fits(value: Any, like: Any) -> bool:
    """Whether `value` has the JSON type of `like` (any number for a number; for a
    dict, each of `like`'s keys present and fitting; for a list, each item fitting
    `like`'s first item)."""
    if like is None:
        return True
    if isinstance(like, bool):
        return isinstance(value, bool)
    if isinstance(like, (int, float)):
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if isinstance(like, dict):
        return isinstance(value, dict) and all(
            k in value and _fits(value[k], v) for k, v in like.items()
        )
    if isinstance(like, list):
        return isinstance(value, list) and (not like or all(_fits(x, like[0]) for x in value))
    return isinstance(value, type(like))


_PROCESS = {"pid": 1, "gpu": "", "memory": 0}


def check_shape(state: Any, initial: dict[str, Any]) -> None:
    """ValueError naming the first field of `state` whose shape is not that of the
    machine's `initial` state (every GPU as the spec has it, processes with pid, GPU
    and memory): what every simulated NVML call relies on."""
    if not isinstance(state, dict):
        raise ValueError("not a JSON object")
    for name, like in initial.items():
        if name == "gpus":
            gpus = state.get("gpus")
            ok = isinstance(gpus, list) and len(gpus) == len(like)
            ok = ok and all(_fits(g, g0) for g, g0 in zip(gpus, like))  # type: ignore[arg-type]
        elif name == "processes":
            ok = _fits(state.get(name), [_PROCESS])
        else:
            ok = _fits(state.get(name), like)
        if not ok:
            raise ValueError(f"field {name!r} does not fit the spec")


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def live_processes(state: dict[str, Any]) -> list[dict[str, Any]]:
    """Processes whose pid still runs (spec-defined, synthetic ones always do)."""
    return [p for p in state["processes"] if p.get("synthetic") or pid_alive(p["pid"])]


class StateFile:
    """Reads (cached by file identity) and atomically updates one machine's state.
    `path` is a string: every simulated NVML client opens one, and pathlib is not
    imported on that way (see gpuwarden.sim.specs)."""

    def __init__(self, spec: specs.Spec, state_dir: Optional[str] = None) -> None:
        self.spec = spec
        self.path = specs.state_file(spec, state_dir)
        self._key: Optional[tuple[int, int, int]] = None
        self._state: Optional[dict[str, Any]] = None

    def read(self) -> dict[str, Any]:
        try:
            st = os.lstat(self.path)
        except FileNotFoundError:
            if self._key is not None or self._state is None:
                self._state = self.spec.initial_state()
                self._key = None
            return self._state
        except OSError as err:  # GPUWARDEN_SIM_STATE names a file, or one we may not read
            raise self._unusable(err) from None
        key = (st.st_ino, st.st_mtime_ns, st.st_size)
        if key != self._key or self._state is None:
            state = self._load()
            if state is None:  # removed meanwhile: the machine was reset
                return self.spec.initial_state()
            self._state, self._key = state, key
        return self._state  # type: ignore[return-value]

    def _load(self) -> Optional[dict[str, Any]]:
        """The state file's contents, checked; None when it is missing. The file lives
        where GPUWARDEN_SIM_STATE says (by default a per-user directory in /tmp, a name
        anyone could take first), so it may be anything: a FIFO, a symlink, huge,
        garbage, JSON of other shapes. Those are refused in one line, never trusted."""
        from gpuwarden.safefiles import UnsafeFile, read_small

        try:
            raw, _ = read_small(self.path, MAX_STATE, what="simulated machine state")
        except FileNotFoundError:
            return None
        except UnsafeFile as err:
            raise UserError(f"{err} (remove it, or `gpuwarden sim reset`)") from None
        except OSError as err:
            raise self._unusable(err) from None
        try:
            state = json.loads(raw.decode("utf-8"))
            check_shape(state, self.spec.initial_state())
        except (ValueError, RecursionError) as err:
            raise UserError(
                f"simulated machine state {self.path} is not a state file: {err} "
                "(remove it, or `gpuwarden sim reset`)"
            ) from None
        return state

    def _locked(self) -> AbstractContextManager[None]:
        """The state lock held, for a writer. contextlib is imported here: readers, every
        simulated NVML client among them, take no lock."""
        from contextlib import contextmanager

        return contextmanager(self._holding)()

    def _holding(self) -> Iterator[None]:
        from gpuwarden.safefiles import flock_within, open_regular

        os.makedirs(os.path.dirname(self.path), exist_ok=True)
        # Not a plain open(): a FIFO there would block, a symlink would be followed.
        lock = self.path + ".lock"
        fd, _ = open_regular(lock, os.O_RDWR | os.O_CREAT, what="simulated machine lock")
        try:
            # Writers hold it for a read, a change and a write: a process that keeps it
            # longer is stopped or stuck, and must not hang every simulator client.
            if not flock_within(fd, LOCK_PATIENCE):
                raise UserError(
                    f"simulated machine lock {lock} has been held by another process for "
                    f"{LOCK_PATIENCE:g} s (a stopped or stuck simulator client? "
                    f"`fuser {lock}` names it)"
                )
            yield
        finally:
            os.close(fd)  # releases the lock

    def _unusable(self, err: OSError) -> UserError:
        return UserError(
            f"simulated machine state {self.path}: {err.strerror} "
            "(GPUWARDEN_SIM_STATE must name a directory you can write)"
        )

    def update(self, change: Callable[[dict[str, Any]], Any]) -> Any:
        """Apply `change` to the current state under the lock and publish the result."""
        try:
            return self._update(change)
        except OSError as err:
            raise self._unusable(err) from None

    def _update(self, change: Callable[[dict[str, Any]], Any]) -> Any:
        with self._locked():
            state = self._load() or self.spec.initial_state()
            state["processes"] = live_processes(state)
            result = change(state)
            # Readers (other NVML clients) take no lock: they see the old or new state.
            write_atomic(self.path, json.dumps(state), what="simulated machine", durable=False)
        return result

    def reset(self) -> None:
        with self._locked():
            try:
                os.unlink(self.path)
            except FileNotFoundError:
                pass


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


def memory_used(state: dict[str, Any], gpu: dict[str, Any], mig: Optional[int] = None) -> int:
    procs = live_processes(state)
    used = sum(
        p["memory"]
        for p in procs
        if p["gpu"] == gpu["uuid"] and (mig is None or p.get("mig") == mig)
    )
    return used + (gpu.get("memory_used", 0) if mig is None else 0)


def utilization(state: dict[str, Any], gpu: dict[str, Any]) -> int:
    """The GPU's load in percent: the spec's figure plus what added processes bring."""
    extra = sum(
        p.get("util", 0)
        for p in live_processes(state)
        if p["gpu"] == gpu["uuid"] and not p.get("synthetic")
    )
    return min(100, gpu["utilization"] + extra)


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
                from gpuwarden.units import format_size

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
