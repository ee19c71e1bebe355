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

from gpuwarden.base.errors import UserError
from gpuwarden.files.safefiles import write_atomic
from gpuwarden.sim import specs

TYPE_CHECKING = False  # typing stays off the start-up path; annotations need it only here
if TYPE_CHECKING:
    from collections.abc import Callable
    from contextlib import AbstractContextManager
    from typing import Any, Optional


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
        from gpuwarden.files.safefiles import UnsafeFile, read_small

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
        from gpuwarden.files.safefiles import flock_within, open_regular

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
            if "accounting" in state:  # a GPU's accounting mode is on (sim.accounting)
                from gpuwarden.sim import accounting

                accounting.track(state, live_processes(state), time.time())
            # Readers (other NVML clients) take no lock: they see the old or new state.
            write_atomic(self.path, json.dumps(state), what="simulated machine", durable=False)
        return result

    def reset(self) -> None:
        with self._locked():
            try:
                os.unlink(self.path)
            except FileNotFoundError:
                pass


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
