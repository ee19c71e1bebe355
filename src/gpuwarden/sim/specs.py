"""Machine specs: TOML files that describe a simulated machine, and their validation.

A spec names each GPU's card model (whose real figures come from `cards.CARDS`)
plus what is going on: temperatures, load, other users' processes, faults. A spec
that is malformed or contradicts itself is refused with one line naming the file,
the line where it can be found, and the field, because specs are hand-written.

Every NVML client of a simulated machine loads its spec at start, so the path
work on that way is done with `os.path` strings: `pathlib` (with the
`urllib.parse` it imports) is imported only where the public API hands
out a `Path` (`SPEC_DIR`, `spec_path`, `state_file`) or a spec is parsed.
"""

from __future__ import annotations

import json
import marshal
import os
import re
import sys

from gpuwarden.errors import UserError
from gpuwarden.records import field, record
from gpuwarden.sim import cards

TYPE_CHECKING = False  # typing stays off the start-up path; annotations need it only here
if TYPE_CHECKING:
    from pathlib import Path
    from typing import Any, Optional

_SPEC_DIR = os.path.join(os.path.dirname(os.path.realpath(__file__)), "specs")


def __getattr__(name: str) -> Any:
    if name == "SPEC_DIR":  # a Path, as it always was, made when first asked for
        from pathlib import Path

        return Path(_SPEC_DIR)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# Synthetic pids for other users' processes sit above any real pid (pid_max is at
# most 2**22), so they can never be mistaken for, or pruned as, a process here.
SYNTHETIC_PID_BASE = 4_200_000

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

_TOP_KEYS = {
    "description",
    "driver",
    "driver_version",
    "cuda_version",
    "nvswitch",
    "hostname",
    "gpu",
}
_GPU_KEYS = {
    "model",
    "uuid",
    "serial",
    "minor",
    "pci_bus_id",
    "numa_node",
    "pcie_switch",
    "temperature",
    "utilization",
    "memory_utilization",
    "memory_used",
    "power",
    "fan",
    "clock_sm",
    "persistence",
    "compute_mode",
    "ecc",
    "ecc_uncorrected",
    "ecc_corrected",
    "retired_pages_pending",
    "remapped_rows_pending",
    "remapped_rows_failure",
    "pcie_replay",
    "throttle",
    "lost",
    "mig",
    "process",
}
_PROC_KEYS = {"pid", "user", "command", "memory", "kind", "mig", "util"}
_MIG_KEYS = {"profile"}


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


def bundled() -> list[str]:
    return sorted(n[: -len(".toml")] for n in os.listdir(_SPEC_DIR) if n.endswith(".toml"))


def spec_path(spec: str) -> Path:
    """The TOML file for a bundled name or a path; unknown names list the bundled ones."""
    from pathlib import Path

    return Path(_spec_file(spec))


def _spec_file(spec: str) -> str:
    if spec.endswith(".toml") or os.sep in spec:
        from pathlib import Path  # its spelling of the path is the spec's identity

        path = str(Path(spec).expanduser())
        if not os.path.isfile(path):
            exists = os.path.exists(path)
            raise UserError(
                f"spec file {spec} {'is not a regular file' if exists else 'not found'}"
            )
        return path
    path = os.path.join(_SPEC_DIR, f"{spec}.toml")
    if not os.path.isfile(path):
        raise UserError(
            f"unknown spec {spec!r}; bundled specs: {', '.join(bundled())} "
            "(or give the path of a .toml file)"
        )
    return path


def state_file(spec: Spec, state_dir: Optional[str] = None) -> Path:
    """Where the machine's mutable state lives: one JSON file per spec in the state dir."""
    from pathlib import Path

    return Path(_state_file(spec, state_dir))


def _state_file(spec: Spec, state_dir: Optional[str] = None) -> str:
    return os.path.join(_state_base(state_dir), f"{_stem(spec.name, spec.path)}.json")


def _state_base(state_dir: Optional[str]) -> str:
    base = state_dir or os.environ.get("GPUWARDEN_SIM_STATE")
    if not base:
        import tempfile

        base = os.path.join(tempfile.gettempdir(), f"gpuwarden-sim-{os.getuid()}")
    return base


def _stem(name: str, path: str) -> str:
    """A bundled spec is known by its name; any other file also by a digest of its path,
    so two `my.toml` in different directories are two machines."""
    if os.path.dirname(path) == _SPEC_DIR:
        return name
    from pathlib import Path

    if Path(path).parent == Path(_SPEC_DIR):  # the same directory, spelt differently
        return name
    import hashlib

    digest = hashlib.sha1(str(Path(path).resolve()).encode()).hexdigest()[:8]
    return f"{name}-{digest}"


def _name_of(path: str) -> str:
    """The file name without its suffix, as `Path.stem` has it."""
    name = os.path.basename(path)
    dot = name.rfind(".")
    return name[:dot] if 0 < dot < len(name) - 1 else name


_CACHE: dict[str, Spec] = {}
_MAX_SPEC_BYTES = 4 << 20  # a spec is a few KiB; more is a wrong file, not a machine

# Bump when the parsed form changes in a way file identities would not show.
_PARSED_FORMAT = 1


def load(spec: str, state_dir: Optional[str] = None) -> Spec:
    """The parsed spec for a bundled name or a path, once per process.

    Every NVML client on a simulated machine (status, run, nvitop through the
    shim) starts by loading its spec, and parsing costs more than the rest of
    the fake's set-up (tomllib, uuid and hashlib imports, validation).
    So the parsed form is also kept as JSON beside the machine's state file,
    keyed by the identity (path, mtime, size) of the spec and of the code that
    parses it; any change to one of them means a fresh parse."""
    path = _spec_file(spec)
    if path not in _CACHE:
        _CACHE[path] = _load_parsed(path, state_dir)
    return _CACHE[path]


def _identity(path: str) -> list[int]:
    st = os.stat(path)
    return [st.st_mtime_ns, st.st_size]


def _parse_file(path: str) -> Spec:
    from pathlib import Path

    try:
        with open(path, "rb") as handle:
            data = handle.read(_MAX_SPEC_BYTES + 1)
    except OSError as err:
        raise UserError(f"spec {path}: cannot read: {err.strerror}") from None
    if len(data) > _MAX_SPEC_BYTES:
        raise UserError(f"spec {path}: too large for a spec (over {_MAX_SPEC_BYTES} bytes)")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as err:
        line = data[: err.start].count(b"\n") + 1
        raise UserError(
            f"spec {path}:{line}: not UTF-8 text (byte 0x{data[err.start]:02x})"
        ) from None
    return parse(text, Path(path))


def _load_parsed(path: str, state_dir: Optional[str]) -> Spec:
    try:
        key = [_PARSED_FORMAT, path, *_identity(path)]
        key += [*_identity(__file__), *_identity(cards.__file__)]
        cache = os.path.join(_state_base(state_dir), f".{_stem(_name_of(path), path)}.spec.json")
    except OSError:
        return _parse_file(path)
    from gpuwarden.safefiles import UnsafeFile, read_small

    try:
        # The cache sits in the state directory (by default a name in /tmp anyone
        # could take first): only a regular file of our own is believed; a FIFO, a
        # symlink, a huge file or another user's file is parsed around, never read.
        raw, st = read_small(cache, 4 * _MAX_SPEC_BYTES, what="spec cache")
        if st.st_uid != os.geteuid():
            raise ValueError("not ours")
        saved = json.loads(raw)
        if saved["key"] == key:
            fields = saved["spec"]
            fields["gpus"] = tuple(fields["gpus"])
            fields["processes"] = tuple(fields["processes"])
            return Spec(**fields)
    except (UnsafeFile, OSError, ValueError, KeyError, TypeError, AttributeError, RecursionError):
        pass
    parsed = _parse_file(path)
    try:  # a state dir we may not write is fine: the next load parses again
        from gpuwarden.safefiles import write_atomic

        os.makedirs(os.path.dirname(cache), exist_ok=True)
        data = json.dumps({"key": key, "spec": vars(parsed)})
        write_atomic(cache, data, what="spec cache", durable=False)
    except (OSError, UserError):
        pass
    return parsed


class _Where:
    """Finds the line of a field in the spec text, for error messages."""

    def __init__(self, text: str, path: Path) -> None:
        self.lines = text.splitlines()
        self.path = path

    def line(self, gpu: Optional[int], key: str, table: str = "gpu", nth: int = 0) -> Optional[int]:
        start = 0
        if gpu is not None:
            headers = [i for i, ln in enumerate(self.lines) if ln.strip() == "[[gpu]]"]
            if gpu < len(headers):
                start = headers[gpu]
            if table != "gpu":
                subs = [
                    i
                    for i, ln in enumerate(self.lines[start + 1 :], start + 1)
                    if ln.strip() == f"[[gpu.{table}]]"
                ]
                if gpu + 1 < len(headers):
                    subs = [i for i in subs if i < headers[gpu + 1]]
                if nth < len(subs):
                    start = subs[nth]
        pattern = re.compile(rf"^\s*{re.escape(key)}\s*=")
        for i in range(start, len(self.lines)):
            if pattern.match(self.lines[i]):
                return i + 1
        return start + 1 if gpu is not None else None

    def fail(self, where: str, message: str, line: Optional[int]) -> UserError:
        at = f"{self.path}:{line}" if line else str(self.path)
        return UserError(f"spec {at}: {where}: {message}")


def _size(value: Any) -> int:
    if isinstance(value, int):
        return value
    from gpuwarden.units import parse_size

    return parse_size(str(value))


def _make_uuid(name: str, index: int, kind: str = "GPU") -> str:
    import uuid as uuidlib

    return f"{kind}-{uuidlib.uuid5(uuidlib.NAMESPACE_URL, f'gpuwarden-sim/{name}/{index}')}"


def parse(text: str, path: Path) -> Spec:
    """Parse and validate spec text; every problem is one UserError line."""
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover - exercised on 3.9/3.10 only
        import tomli as tomllib

    where = _Where(text, path)
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as err:
        raise UserError(f"spec {path}: malformed TOML: {err}") from None
    name = path.stem
    for key in data:
        if key not in _TOP_KEYS:
            raise where.fail(
                key, f"unknown field (known: {', '.join(sorted(_TOP_KEYS))})", where.line(None, key)
            )
    driver = bool(data.get("driver", True))
    gpus_in = data.get("gpu", [])
    if not isinstance(gpus_in, list):
        raise where.fail("gpu", "must be an array of tables ([[gpu]])", where.line(None, "gpu"))
    cuda_text = str(data.get("cuda_version", "12.4"))
    match = re.fullmatch(r"(\d+)\.(\d+)", cuda_text)
    if not match:
        raise where.fail(
            "cuda_version",
            f"expected MAJOR.MINOR, got {cuda_text!r}",
            where.line(None, "cuda_version"),
        )
    cuda = int(match.group(1)) * 1000 + int(match.group(2)) * 10
    gpus: list[dict[str, Any]] = []
    procs: list[dict[str, Any]] = []
    next_pid = SYNTHETIC_PID_BASE
    seen_bus: set[str] = set()
    seen_minor: set[int] = set()
    for i, g in enumerate(gpus_in):
        for key in g:
            if key not in _GPU_KEYS:
                raise where.fail(
                    f"gpu[{i}].{key}",
                    f"unknown field (known: {', '.join(sorted(_GPU_KEYS))})",
                    where.line(i, key),
                )
        model = g.get("model")
        if model not in cards.CARDS:
            raise where.fail(
                f"gpu[{i}].model",
                f"unknown card {model!r}; known: {', '.join(cards.CARDS)}",
                where.line(i, "model"),
            )
        card = cards.CARDS[model]
        unsupported = set(card["unsupported"])  # type: ignore[arg-type]
        bus = g.get("pci_bus_id", f"00000000:{0x07 + 0x10 * i:02X}:00.0")
        if not re.fullmatch(r"[0-9A-Fa-f]{8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-7]", bus):
            raise where.fail(
                f"gpu[{i}].pci_bus_id",
                f"expected DDDDDDDD:BB:DD.F, got {bus!r}",
                where.line(i, "pci_bus_id"),
            )
        if bus.upper() in seen_bus:
            raise where.fail(
                f"gpu[{i}].pci_bus_id", f"{bus} is used by two GPUs", where.line(i, "pci_bus_id")
            )
        seen_bus.add(bus.upper())
        # The driver numbers /dev/nvidiaN itself; it need not follow the PCI (index)
        # order, and 254/255 are nvidia-modeset and nvidiactl.
        minor = g.get("minor", i)
        if isinstance(minor, bool) or not isinstance(minor, int) or not 0 <= minor <= 253:
            raise where.fail(
                f"gpu[{i}].minor",
                f"expected an integer 0-253 (/dev/nvidiaN), got {minor!r}",
                where.line(i, "minor"),
            )
        if minor in seen_minor:
            raise where.fail(
                f"gpu[{i}].minor", f"{minor} is used by two GPUs", where.line(i, "minor")
            )
        seen_minor.add(minor)
        throttle = g.get("throttle", [])
        for reason in throttle:
            if reason not in THROTTLE_BITS:
                raise where.fail(
                    f"gpu[{i}].throttle",
                    f"unknown reason {reason!r}; known: {', '.join(THROTTLE_BITS)}",
                    where.line(i, "throttle"),
                )
        mode = g.get("compute_mode", "Default")
        if mode not in COMPUTE_MODES:
            raise where.fail(
                f"gpu[{i}].compute_mode",
                f"expected one of {', '.join(COMPUTE_MODES)}",
                where.line(i, "compute_mode"),
            )
        for pct in ("temperature", "utilization", "memory_utilization", "fan"):
            value = g.get(pct)
            if value is not None and (
                not isinstance(value, int) or value < 0 or (pct != "temperature" and value > 100)
            ):
                raise where.fail(
                    f"gpu[{i}].{pct}",
                    f"expected an integer percentage, got {value!r}",
                    where.line(i, pct),
                )
        try:
            extra = _size(g.get("memory_used", 0))
        except UserError as err:
            raise where.fail(
                f"gpu[{i}].memory_used", str(err), where.line(i, "memory_used")
            ) from None
        uuid = g.get("uuid") or _make_uuid(name, i)
        gpu: dict[str, Any] = {
            "index": i,
            "uuid": uuid,
            "model": model,
            "name": card["name"],
            "serial": g.get("serial", f"{1320000000000 + 7919 * (i + 1) + len(name)}"),
            "pci_bus_id": bus.upper(),
            "minor": minor,
            "numa_node": int(g.get("numa_node", 0)),
            "pcie_switch": int(g.get("pcie_switch", i)),
            "memory_total": card["memory_total"],
            "memory_reserved": card["memory_reserved"],
            "memory_used": extra,
            "temperature": int(g.get("temperature", 35)),
            "utilization": int(g.get("utilization", 0)),
            "memory_utilization": int(g.get("memory_utilization", 0)),
            "power_limit": card["power_limit"],
            "power": float(g.get("power", round(0.15 * float(card["power_limit"]), 1))),  # type: ignore[arg-type]
            "fan": None if cards.FAN in unsupported else int(g.get("fan", 30)),
            "clock_sm": int(g.get("clock_sm", 210)),
            "clock_sm_max": card["clock_sm_max"],
            "clock_mem_max": card["clock_mem_max"],
            "compute_capability": list(card["compute_capability"]),  # type: ignore[call-overload]
            "pci_device_id": card["pci_device_id"],
            "pci_subsystem_id": card["pci_subsystem_id"],
            "persistence": bool(g.get("persistence", True)),
            "compute_mode": mode,
            "ecc": bool(g.get("ecc", card["ecc_default"])),
            "ecc_uncorrected": int(g.get("ecc_uncorrected", 0)),
            "ecc_corrected": int(g.get("ecc_corrected", 0)),
            "retired_pages_pending": bool(g.get("retired_pages_pending", False)),
            "remapped_rows_pending": bool(g.get("remapped_rows_pending", False)),
            "remapped_rows_failure": bool(g.get("remapped_rows_failure", False)),
            "pcie_replay": int(g.get("pcie_replay", 0)),
            "throttle": list(throttle),
            "lost": bool(g.get("lost", False)),
            "nvlinks": card["nvlinks"],
            "max_mig": card.get("max_mig", 0),
            "unsupported": sorted(unsupported),
            "mig": False,
            "mig_instances": [],
            "energy_base": 1_000_000 * (i + 3),
        }
        for key, feature in (
            ("ecc_uncorrected", cards.ECC),
            ("mig", cards.MIG),
            ("remapped_rows_pending", cards.REMAP),
            ("retired_pages_pending", cards.RETIRE),
        ):
            if g.get(key) and feature in unsupported:
                raise where.fail(
                    f"gpu[{i}].{key}",
                    f"{card['name']} does not support {feature}",
                    where.line(i, key),
                )
        migs = g.get("mig", [])
        if migs:
            profiles = cards.MIG_PROFILES.get(model, {})
            gpu["mig"] = True
            slices = 0
            for m, entry in enumerate(migs):
                profile = entry.get("profile") if isinstance(entry, dict) else None
                if profile not in profiles:
                    raise where.fail(
                        f"gpu[{i}].mig[{m}].profile",
                        f"unknown profile {profile!r}; known: {', '.join(profiles)}",
                        where.line(i, "profile", "mig", m),
                    )
                mem, size = profiles[profile]
                slices += size
                gpu["mig_instances"].append(
                    {
                        "index": m,
                        "uuid": _make_uuid(name, 1000 * (i + 1) + m, "MIG"),
                        "profile": profile,
                        "memory_total": mem * cards.MiB,
                        "gpu_instance_id": [1, 2, 3, 5, 7, 9, 11][m % 7],
                        "compute_instance_id": 0,
                    }
                )
            if slices > 7:
                raise where.fail(
                    f"gpu[{i}].mig",
                    f"profiles need {slices} slices; the card has 7",
                    where.line(i, "profile", "mig"),
                )
        used = extra
        for p, entry in enumerate(g.get("process", [])):
            for key in entry:
                if key not in _PROC_KEYS:
                    raise where.fail(
                        f"gpu[{i}].process[{p}].{key}",
                        f"unknown field (known: {', '.join(sorted(_PROC_KEYS))})",
                        where.line(i, key, "process", p),
                    )
            try:
                memory = _size(entry.get("memory", 0))
            except UserError as err:
                raise where.fail(
                    f"gpu[{i}].process[{p}].memory", str(err), where.line(i, "memory", "process", p)
                ) from None
            mig = entry.get("mig")
            if mig is not None and not (gpu["mig"] and 0 <= mig < len(gpu["mig_instances"])):
                raise where.fail(
                    f"gpu[{i}].process[{p}].mig",
                    "no such MIG instance on this GPU",
                    where.line(i, "mig", "process", p),
                )
            used += memory
            pid = entry.get("pid")
            if pid is None:
                pid = next_pid
                next_pid += 1
            procs.append(
                {
                    "pid": int(pid),
                    "gpu": uuid,
                    "memory": memory,
                    "user": entry.get("user", "root"),
                    "command": entry.get("command", "python"),
                    "kind": entry.get("kind", "compute"),
                    "mig": mig,
                    "util": int(entry.get("util", 0)),
                    "synthetic": True,
                }
            )
        capacity = int(gpu["memory_total"]) - int(gpu["memory_reserved"])  # type: ignore[call-overload]
        if used > capacity:
            from gpuwarden.units import format_size

            raise where.fail(
                f"gpu[{i}].process",
                f"memory used {format_size(used)} > total {format_size(capacity)} "
                f"usable on {card['name']}",
                where.line(i, "memory", "process", 0),
            )
        gpus.append(gpu)
    if driver and not gpus:
        raise where.fail(
            "gpu",
            "a machine with a driver needs at least one [[gpu]] (or set driver = false)",
            None,
        )
    return Spec(
        name=name,
        path=str(path),
        driver=driver,
        driver_version=str(data.get("driver_version", "550.54.15")),
        cuda_version=cuda,
        description=str(data.get("description", "")),
        nvswitch=bool(data.get("nvswitch", False)),
        gpus=tuple(gpus),
        processes=tuple(procs),
    )
