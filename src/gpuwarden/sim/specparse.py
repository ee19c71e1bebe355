"""Reading a machine spec's TOML: parsing and validating it into a `Spec`.

Imported only by `specs.load` on a miss of its parsed-form cache (the first
client of a machine, or after the spec or this code changed), so tomllib, uuid and
the validation tables stay off the start-up path of every other NVML client. A
spec that is malformed or contradicts itself is refused with one line naming the
file, the line where it can be found, and the field, because specs are hand-written.
"""

from __future__ import annotations

import re
import sys

from gpuwarden.base.errors import UserError
from gpuwarden.sim import cards, specdata
from gpuwarden.sim.specdata import COMPUTE_MODES, THROTTLE_BITS, Spec

TYPE_CHECKING = False  # typing stays off the start-up path; annotations need it only here
if TYPE_CHECKING:
    from typing import Any, Optional

# Synthetic pids for other users' processes sit above any real pid (pid_max is at
# most 2**22), so they can never be mistaken for, or pruned as, a process here.
SYNTHETIC_PID_BASE = 4_200_000

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
    "nvlink_peer",
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


class _Where:
    """Finds the line of a field in the spec text, for error messages."""

    def __init__(self, text: str, path: str) -> None:
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
        at = f"{self.path}:{line}" if line else self.path
        return UserError(f"spec {at}: {where}: {message}")


def _make_uuid(name: str, index: int, kind: str = "GPU") -> str:
    import uuid as uuidlib

    return f"{kind}-{uuidlib.uuid5(uuidlib.NAMESPACE_URL, f'gpuwarden-sim/{name}/{index}')}"


def parse(text: str, path: str) -> Spec:
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
    from pathlib import PurePath

    name = PurePath(path).stem
    for key in data:
        if key not in _TOP_KEYS:
            raise where.fail(
                key, f"unknown field (known: {', '.join(sorted(_TOP_KEYS))})", where.line(None, key)
            )
    driver = bool(data.get("driver", True))
    gpus_in = data.get("gpu", [])
    if not isinstance(gpus_in, list):
        raise where.fail("gpu", "must be an array of tables ([[gpu]])", where.line(None, "gpu"))
    machine = _Machine(where, name)
    for i, g in enumerate(gpus_in):
        machine.add(i, g)
    machine.check_bridges()
    if driver and not machine.gpus:
        raise where.fail(
            "gpu",
            "a machine with a driver needs at least one [[gpu]] (or set driver = false)",
            None,
        )
    return Spec(
        name=name,
        path=path,
        driver=driver,
        driver_version=str(data.get("driver_version", "550.54.15")),
        cuda_version=_cuda_version(where, data),
        description=str(data.get("description", "")),
        nvswitch=bool(data.get("nvswitch", False)),
        gpus=tuple(machine.gpus),
        processes=tuple(machine.processes),
    )


def _cuda_version(where: _Where, data: dict[str, Any]) -> int:
    """The driver's CUDA version as NVML encodes it (12.4 -> 12040)."""
    cuda_text = str(data.get("cuda_version", "12.4"))
    match = re.fullmatch(r"(\d+)\.(\d+)", cuda_text)
    if not match:
        raise where.fail(
            "cuda_version",
            f"expected MAJOR.MINOR, got {cuda_text!r}",
            where.line(None, "cuda_version"),
        )
    return int(match.group(1)) * 1000 + int(match.group(2)) * 10


class _Machine:
    """The GPUs and processes of one spec, checked as they are added.

    What is unique across the machine (bus ids, device minors, synthetic pids) is
    kept here, so each `[[gpu]]` table is checked against the ones before it.
    """

    def __init__(self, where: _Where, name: str) -> None:
        self.where = where
        self.name = name
        self.gpus: list[dict[str, Any]] = []
        self.processes: list[dict[str, Any]] = []
        self.next_pid = SYNTHETIC_PID_BASE
        self.seen_bus: set[str] = set()
        self.seen_minor: set[int] = set()

    def add(self, i: int, g: dict[str, Any]) -> None:
        """Check the i-th `[[gpu]]` table and add it with its MIG slices and processes."""
        where = self.where
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
        lacking = card["unsupported"]  # a tuple of feature names in every entry of CARDS
        unsupported: set[str] = set(lacking) if isinstance(lacking, tuple) else set()
        bus = self._bus(i, g)
        minor = self._minor(i, g)
        throttle, mode = self._states(i, g)
        try:
            extra = specdata.size(g.get("memory_used", 0))
        except UserError as err:
            raise where.fail(
                f"gpu[{i}].memory_used", str(err), where.line(i, "memory_used")
            ) from None
        uuid = g.get("uuid") or _make_uuid(self.name, i)
        gpu: dict[str, Any] = {
            "index": i,
            "uuid": uuid,
            "model": model,
            "name": card["name"],
            "serial": g.get("serial", f"{1320000000000 + 7919 * (i + 1) + len(self.name)}"),
            "pci_bus_id": bus,
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
            gpu["mig"] = True
            gpu["mig_instances"] = self._mig_instances(i, model, migs)
        peer = g.get("nvlink_peer")
        if peer is not None:  # an NVLink bridge to one other GPU (PCIe cards in pairs)
            if cards.NVLINK in unsupported or not isinstance(peer, int) or peer == i:
                raise where.fail(
                    f"gpu[{i}].nvlink_peer",
                    "expected the index of another GPU with NVLink",
                    where.line(i, "nvlink_peer"),
                )
            gpu["nvlink_peer"] = peer  # only where given: states of other specs keep their shape
        used = extra + self._processes(i, gpu, g.get("process", []))
        capacity = int(gpu["memory_total"]) - int(gpu["memory_reserved"])  # type: ignore[call-overload]
        if used > capacity:
            from gpuwarden.base.units import format_size

            raise where.fail(
                f"gpu[{i}].process",
                f"memory used {format_size(used)} > total {format_size(capacity)} "
                f"usable on {card['name']}",
                where.line(i, "memory", "process", 0),
            )
        self.gpus.append(gpu)

    def _bus(self, i: int, g: dict[str, Any]) -> str:
        """The GPU's PCI bus id, upper-case, unique on the machine."""
        where = self.where
        bus = g.get("pci_bus_id", f"00000000:{0x07 + 0x10 * i:02X}:00.0")
        if not isinstance(bus, str) or not re.fullmatch(
            r"[0-9A-Fa-f]{8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-7]", bus
        ):
            raise where.fail(
                f"gpu[{i}].pci_bus_id",
                f"expected DDDDDDDD:BB:DD.F, got {bus!r}",
                where.line(i, "pci_bus_id"),
            )
        if bus.upper() in self.seen_bus:
            raise where.fail(
                f"gpu[{i}].pci_bus_id", f"{bus} is used by two GPUs", where.line(i, "pci_bus_id")
            )
        self.seen_bus.add(bus.upper())
        return bus.upper()

    def _minor(self, i: int, g: dict[str, Any]) -> int:
        """The GPU's /dev/nvidiaN number, unique on the machine.

        The driver numbers /dev/nvidiaN itself; it need not follow the PCI (index)
        order, and 254/255 are nvidia-modeset and nvidiactl.
        """
        where = self.where
        minor = g.get("minor", i)
        if isinstance(minor, bool) or not isinstance(minor, int) or not 0 <= minor <= 253:
            raise where.fail(
                f"gpu[{i}].minor",
                f"expected an integer 0-253 (/dev/nvidiaN), got {minor!r}",
                where.line(i, "minor"),
            )
        if minor in self.seen_minor:
            raise where.fail(
                f"gpu[{i}].minor", f"{minor} is used by two GPUs", where.line(i, "minor")
            )
        self.seen_minor.add(minor)
        return minor

    def _states(self, i: int, g: dict[str, Any]) -> tuple[list[str], str]:
        """The GPU's throttle reasons and compute mode; its percentages checked."""
        where = self.where
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
        return list(throttle), str(mode)

    def _mig_instances(self, i: int, model: str, migs: list[Any]) -> list[dict[str, Any]]:
        """The GPU's MIG slices, which must fit its seven compute slices."""
        where = self.where
        profiles = cards.MIG_PROFILES.get(model, {})
        instances: list[dict[str, Any]] = []
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
            instances.append(
                {
                    "index": m,
                    "uuid": _make_uuid(self.name, 1000 * (i + 1) + m, "MIG"),
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
        return instances

    def _processes(self, i: int, gpu: dict[str, Any], entries: list[Any]) -> int:
        """Add the GPU's `[[gpu.process]]` tables; the memory they use in all."""
        where = self.where
        used = 0
        for p, entry in enumerate(entries):
            for key in entry:
                if key not in _PROC_KEYS:
                    raise where.fail(
                        f"gpu[{i}].process[{p}].{key}",
                        f"unknown field (known: {', '.join(sorted(_PROC_KEYS))})",
                        where.line(i, key, "process", p),
                    )
            try:
                memory = specdata.size(entry.get("memory", 0))
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
                pid = self.next_pid
                self.next_pid += 1
            self.processes.append(
                {
                    "pid": int(pid),
                    "gpu": gpu["uuid"],
                    "memory": memory,
                    "user": entry.get("user", "root"),
                    "command": entry.get("command", "python"),
                    "kind": entry.get("kind", "compute"),
                    "mig": mig,
                    "util": int(entry.get("util", 0)),
                    "synthetic": True,
                }
            )
        return used

    def check_bridges(self) -> None:
        """An NVLink bridge joins two GPUs: each must name the other."""
        for i, gpu in enumerate(self.gpus):
            peer = gpu.get("nvlink_peer")
            if peer is not None and not (
                0 <= peer < len(self.gpus) and self.gpus[peer].get("nvlink_peer") == i
            ):
                raise self.where.fail(
                    f"gpu[{i}].nvlink_peer",
                    f"GPU {peer} must name GPU {i} as its nvlink_peer too (a bridge joins both)",
                    self.where.line(i, "nvlink_peer"),
                )
