"""The one seam to the hardware: read a frozen `Snapshot` through a pynvml-like module.

Only this module (and the health event loop) call NVML. Everything else —
selection, leases, status, the exporter, the doctor — reads `Snapshot`s, so
it can be tested on hand-built snapshots and on the simulated machine alike.
The simulator replaces the `pynvml` module itself, so the code below is the
same code that runs against a real driver.

Each field NVML cannot answer for a card (NotSupported, NoPermission, ...) is
`None`, never an exception; a GPU that is lost is returned with `lost=True`
while the others are still read; a machine without a driver is a valid, empty
snapshot whose `error` says why.
"""

from __future__ import annotations

import os
import time

from gpuwarden.base.records import field, record, replace

# GpuProcess is part of a Snapshot, so it is named here too (inventory.GpuProcess).
from gpuwarden.machine.gpuprocesses import GpuProcess as GpuProcess
from gpuwarden.machine.gpuprocesses import SimOwners, read_processes

TYPE_CHECKING = False  # typing stays off the start-up path; annotations need it only here
if TYPE_CHECKING:
    from typing import Any, Optional

# Topology levels as NVML reports them (nvmlGpuTopologyLevel_t); lower is closer.
TOPOLOGY_INTERNAL = 0  # the same board (multi-GPU card)
TOPOLOGY_SINGLE = 10  # one PCIe switch between them
TOPOLOGY_MULTIPLE = 20  # several PCIe switches, no host bridge
TOPOLOGY_HOSTBRIDGE = 30  # the same host bridge
TOPOLOGY_NODE = 40  # the same NUMA node
TOPOLOGY_SYSTEM = 50  # across NUMA nodes (SMP interconnect)


def dotted(version: Optional[tuple[int, ...]]) -> Optional[str]:
    """(12, 4) -> "12.4", None -> None: how versions and compute capabilities are printed."""
    return ".".join(map(str, version)) if version else None


@record
class MigInstance:
    """A MIG device carved out of a physical GPU; CUDA sees it as its own device."""

    uuid: str  # "MIG-..."
    index: int  # MIG device index within the parent
    gpu_instance_id: Optional[int] = None
    compute_instance_id: Optional[int] = None
    name: Optional[str] = None  # profile, e.g. "1g.10gb"
    memory_total: Optional[int] = None
    memory_used: Optional[int] = None
    counters: tuple[tuple[str, float], ...] = ()  # read only when asked (`exporter.counters`)


@record
class Gpu:
    """One physical GPU as NVML saw it at `Snapshot.taken_at`.

    `index` is NVML's index: PCI bus order, the number nvidia-smi prints.
    Identity is `uuid`; indices are presentation only.
    """

    index: int
    uuid: str
    name: Optional[str] = None
    pci_bus_id: Optional[str] = None
    minor: Optional[int] = None  # /dev/nvidia<minor>: what device isolation allows or denies
    memory_total: Optional[int] = None  # bytes
    memory_used: Optional[int] = None
    memory_free: Optional[int] = None
    utilization_gpu: Optional[int] = None  # percent, 0-100
    utilization_memory: Optional[int] = None  # percent, 0-100
    temperature: Optional[int] = None  # degrees Celsius
    power_draw: Optional[float] = None  # watts
    power_limit: Optional[float] = None  # watts
    energy_consumed: Optional[float] = None  # joules since driver load
    fan_speed: Optional[int] = None  # percent
    clock_sm: Optional[int] = None  # MHz
    clock_sm_max: Optional[int] = None  # MHz
    compute_capability: Optional[tuple[int, int]] = None
    persistence_mode: Optional[bool] = None
    compute_mode: Optional[str] = None  # "Default", "Exclusive_Process", "Prohibited"
    mig_mode: Optional[bool] = None
    mig_instances: tuple[MigInstance, ...] = ()
    ecc_mode: Optional[bool] = None
    ecc_uncorrected_volatile: Optional[int] = None
    ecc_corrected_volatile: Optional[int] = None
    retired_pages_pending: Optional[bool] = None
    remapped_rows_pending: Optional[bool] = None
    remapped_rows_failure: Optional[bool] = None
    pcie_replay_count: Optional[int] = None
    throttle_reasons: Optional[tuple[str, ...]] = None  # e.g. ("hw_thermal", "sw_power_cap")
    processes: tuple[GpuProcess, ...] = ()
    counters: tuple[tuple[str, float], ...] = ()  # read only when asked (`exporter.counters`)
    lost: bool = False  # NVML said GpuIsLost (fallen off the bus)
    error: Optional[str] = None  # why the GPU could not be read, when lost or broken


@record
class Snapshot:
    """The whole machine at one moment. Cheap to pass around, safe to share."""

    taken_at: float  # time.time()
    hostname: str
    gpus: tuple[Gpu, ...] = ()
    driver_version: Optional[str] = None  # e.g. "550.54.15"
    cuda_driver_version: Optional[tuple[int, int]] = None  # newest CUDA the driver runs, (12, 4)
    nvml_version: Optional[str] = None
    source: str = "nvml"  # "nvml", or "sim:<spec name>" on the simulated machine
    error: Optional[str] = None  # why there are no GPUs (no driver, init failed)
    # NVML topology level between two GPUs, keyed by sorted (index, index); only
    # filled when asked for (it costs n^2 NVML calls). See TOPOLOGY_* above.
    topology: dict[tuple[int, int], int] = field(default_factory=dict, compare=False)
    # Number of NVLink links that join two GPUs, keyed like `topology`.
    nvlinks: dict[tuple[int, int], int] = field(default_factory=dict, compare=False)

    def gpu(self, uuid: str) -> Optional[Gpu]:
        return next((g for g in self.gpus if g.uuid == uuid), None)


# Bits of nvmlDeviceGetCurrentClocksEventReasons (formerly "throttle reasons"), by name.
THROTTLE_REASONS: dict[int, str] = {
    0x1: "gpu_idle",
    0x2: "applications_clocks_setting",
    0x4: "sw_power_cap",
    0x8: "hw_slowdown",
    0x10: "sync_boost",
    0x20: "sw_thermal",
    0x40: "hw_thermal",
    0x80: "hw_power_brake",
    0x100: "display_clocks_setting",
}
_COMPUTE_MODES = {0: "Default", 1: "Exclusive_Thread", 2: "Prohibited", 3: "Exclusive_Process"}
NO_DRIVER = "no NVIDIA driver found (libnvidia-ml.so.1 not loadable); CPU only"


def load_nvml() -> Any:
    """The pynvml-like module to read: the simulator's when GPUWARDEN_SIM is set, else
    nvidia-ml-py's `pynvml`. Raises ImportError when neither can be had."""
    if os.environ.get("GPUWARDEN_SIM"):
        from gpuwarden.sim.fake import module

        return module()
    from gpuwarden.machine.nvmlload import without_unused_modules

    return without_unused_modules(lambda: __import__("pynvml"))


def _text(value: Any) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


# NVML functions found missing in this process: each is logged once, not per GPU or read.
_MISSING: set[str] = set()


def missing_function(func: str, why: str) -> None:
    """Log, once per process, that `func` cannot be called (an older driver, or an
    nvidia-ml-py without the binding): every field it feeds reads n/a, and without
    this line nobody could tell a missing function from a card that lacks a feature.
    As nvitop's nvmlQuery does. `logging` is imported only when this happens."""
    if func in _MISSING:
        return
    _MISSING.add(func)
    import logging

    logging.getLogger(__name__).warning("NVML function %s is unavailable (%s)", func, why)


class _Reader:
    """Calls NVML so that what the card cannot answer becomes None: the one path through
    which the inventory asks the driver for a field."""

    def __init__(self, nv: Any) -> None:
        self.nv = nv
        self.soft = (nv.NVMLError_NotSupported, nv.NVMLError_NoPermission)
        self.soft += tuple(
            getattr(nv, name)
            for name in ("NVMLError_NotFound", "NVMLError_InvalidArgument", "NVMLError_Unknown")
            if hasattr(nv, name)
        )

    def get(self, func: str, *args: Any) -> Any:
        """None for what the card cannot say; GpuIsLost propagates (the GPU is gone). A
        function the driver or nvidia-ml-py lacks is None too, logged once."""
        call = getattr(self.nv, func, None)
        if call is None:
            missing_function(func, "this nvidia-ml-py has no binding for it")
            return None
        try:
            return call(*args)
        except self.nv.NVMLError_FunctionNotFound:
            missing_function(func, "the driver does not provide it")
            return None
        except self.soft:
            return None
        except self.nv.NVMLError_GpuIsLost:
            raise
        except self.nv.NVMLError:
            return None


def read_snapshot(
    nvml: Any = None,
    *,
    processes: bool = True,
    topology: bool = False,
    detail: bool = True,
    counters: Any = None,
) -> Snapshot:
    """Read the machine once. `nvml` defaults to `load_nvml()`; never raises for
    hardware conditions (see the module docstring). Without `detail`, only what
    choosing a GPU decides on is read (no temperature, power, energy, fan, clocks,
    persistence or compute mode: a third of the calls per GPU, and on some cards the
    slowest ones); those fields are then None. `counters`: see `gpuwarden.exporter.counters`."""
    hostname = os.uname().nodename  # what gethostname() returns, without importing socket
    now = time.time()
    if nvml is None:
        try:
            nvml = load_nvml()
        except ImportError as err:
            return Snapshot(
                taken_at=now,
                hostname=hostname,
                source="nvml",
                error=f"cannot import pynvml ({err}); CPU only",
            )
    source = f"sim:{nvml.gpuwarden_sim_spec}" if hasattr(nvml, "gpuwarden_sim_spec") else "nvml"
    try:
        nvml.nvmlInit()
    except nvml.NVMLError_LibraryNotFound:
        return Snapshot(taken_at=now, hostname=hostname, source=source, error=NO_DRIVER)
    except nvml.NVMLError as err:
        return Snapshot(
            taken_at=now,
            hostname=hostname,
            source=source,
            error=f"NVML initialisation failed: {err}",
        )
    try:
        return _read(nvml, hostname, now, source, processes, topology, detail, counters)
    finally:
        try:
            nvml.nvmlShutdown()
        except nvml.NVMLError:
            pass


def read_use(nv: Any, gpus: tuple[Gpu, ...], held: bool = False) -> tuple[Gpu, ...]:
    """`gpus` (of an earlier snapshot) with what they use now read again: memory,
    utilization and processes, 4 NVML calls a GPU instead of a whole snapshot's 20 and
    more. What a decision to start a job on them needs; a GPU lost since is `lost`.
    `held`: the caller holds NVML initialised (a real driver's nvmlInit costs far more
    than the reading), else it is initialised and shut down around the reading."""
    if not held:
        nv.nvmlInit()  # the caller read `gpus` through it: it is there
    known = SimOwners(getattr(nv, "gpuwarden_sim_processes", None))
    r = _Reader(nv)
    out = []
    try:
        for gpu in gpus:
            try:
                handle = nv.nvmlDeviceGetHandleByIndex(gpu.index)
                fields = _read_use(nv, r, handle, gpu, known)
            except nv.NVMLError as err:  # lost, or gone from the bus
                fields = {"lost": True, "error": f"cannot read it again: {err}"}
            out.append(replace(gpu, **fields))
    finally:
        if not held:
            try:
                nv.nvmlShutdown()
            except nv.NVMLError:
                pass
    return tuple(out)


def _read_use(nv: Any, r: _Reader, handle: Any, gpu: Gpu, known: SimOwners) -> dict[str, Any]:
    f: dict[str, Any] = {}
    memory = r.get("nvmlDeviceGetMemoryInfo", handle)
    if memory is not None:
        f["memory_used"], f["memory_free"] = int(memory.used), int(memory.free)
    util = r.get("nvmlDeviceGetUtilizationRates", handle)
    if util is not None:
        f["utilization_gpu"], f["utilization_memory"] = int(util.gpu), int(util.memory)
    by_instance = {(m.gpu_instance_id, m.compute_instance_id): m.uuid for m in gpu.mig_instances}
    f["processes"] = read_processes(r.get, handle, by_instance, known)
    return f


def _read(
    nv: Any,
    hostname: str,
    now: float,
    source: str,
    processes: bool,
    topology: bool,
    detail: bool = True,
    counters: Any = None,
) -> Snapshot:
    r = _Reader(nv)
    driver = r.get("nvmlSystemGetDriverVersion")
    cuda = r.get("nvmlSystemGetCudaDriverVersion_v2") or r.get("nvmlSystemGetCudaDriverVersion")
    nvml_version = r.get("nvmlSystemGetNVMLVersion")
    count = nv.nvmlDeviceGetCount()
    known = SimOwners(getattr(nv, "gpuwarden_sim_processes", None))
    gpus = []
    handles: dict[int, Any] = {}
    for index in range(count):
        try:
            handle = nv.nvmlDeviceGetHandleByIndex(index)
        except nv.NVMLError as err:
            lost = isinstance(err, nv.NVMLError_GpuIsLost)
            gpus.append(
                Gpu(
                    index=index,
                    uuid=f"unknown-{index}",
                    lost=lost,
                    error=f"cannot get a handle: {err}",
                )
            )
            continue
        gpu = _read_gpu(nv, r, index, handle, processes, known, detail)
        if not gpu.lost:
            handles[index] = handle
            gpu = counters.read(nv, r.get, handle, gpu) if counters is not None else gpu
        gpus.append(gpu)
    topo: dict[tuple[int, int], int] = {}
    links: dict[tuple[int, int], int] = {}
    if topology:
        from gpuwarden.machine.topology import read_topology  # n^2 calls: only when asked for

        bus_ids = {g.index: g.pci_bus_id for g in gpus if g.pci_bus_id}
        topo, links = read_topology(nv, r.get, handles, bus_ids)
    return Snapshot(
        taken_at=now,
        hostname=hostname,
        gpus=tuple(gpus),
        driver_version=_text(driver) if driver is not None else None,
        cuda_driver_version=(cuda // 1000, (cuda % 1000) // 10) if cuda else None,
        nvml_version=_text(nvml_version) if nvml_version is not None else None,
        source=source,
        topology=topo,
        nvlinks=links,
    )


def _read_gpu(
    nv: Any,
    r: _Reader,
    index: int,
    handle: Any,
    processes: bool,
    known: SimOwners,
    detail: bool = True,
) -> Gpu:
    uuid = f"unknown-{index}"
    fields: dict[str, Any] = {}
    try:
        uuid = _text(nv.nvmlDeviceGetUUID(handle))
        name = r.get("nvmlDeviceGetName", handle)
        fields["name"] = _text(name) if name is not None else None
        pci = r.get("nvmlDeviceGetPciInfo", handle)
        fields["pci_bus_id"] = _text(pci.busId) if pci is not None else None
        fields["minor"] = r.get("nvmlDeviceGetMinorNumber", handle)
        fields.update(_read_state(nv, r, handle))
        if detail:
            fields.update(_read_detail(nv, r, handle))
        if processes:
            migs = fields.get("mig_instances", ())
            by_instance = {(m.gpu_instance_id, m.compute_instance_id): m.uuid for m in migs}
            fields["processes"] = read_processes(r.get, handle, by_instance, known)
    except nv.NVMLError_GpuIsLost as err:
        return Gpu(
            index=index,
            uuid=uuid,
            name=fields.get("name"),
            pci_bus_id=fields.get("pci_bus_id"),
            minor=fields.get("minor"),
            lost=True,
            error=f"GPU is lost: {err}",
        )
    return Gpu(index=index, uuid=uuid, **fields)


def _read_state(nv: Any, r: _Reader, handle: Any) -> dict[str, Any]:
    f: dict[str, Any] = {}
    memory = None
    if hasattr(nv, "nvmlMemory_v2"):
        memory = r.get("nvmlDeviceGetMemoryInfo", handle, nv.nvmlMemory_v2)
    if memory is None:
        memory = r.get("nvmlDeviceGetMemoryInfo", handle)
    if memory is not None:
        f["memory_total"], f["memory_used"], f["memory_free"] = (
            int(memory.total),
            int(memory.used),
            int(memory.free),
        )
    util = r.get("nvmlDeviceGetUtilizationRates", handle)
    if util is not None:
        f["utilization_gpu"], f["utilization_memory"] = int(util.gpu), int(util.memory)
    cc = r.get("nvmlDeviceGetCudaComputeCapability", handle)
    f["compute_capability"] = (int(cc[0]), int(cc[1])) if cc is not None else None
    mig = r.get("nvmlDeviceGetMigMode", handle)
    f["mig_mode"] = bool(mig[0]) if mig is not None else None
    if f["mig_mode"]:
        f["mig_instances"] = _read_mig(nv, r, handle)
    ecc = r.get("nvmlDeviceGetEccMode", handle)
    f["ecc_mode"] = bool(ecc[0]) if ecc is not None else None
    if f["ecc_mode"]:
        f["ecc_uncorrected_volatile"] = r.get(
            "nvmlDeviceGetTotalEccErrors",
            handle,
            nv.NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
            nv.NVML_VOLATILE_ECC,
        )
        f["ecc_corrected_volatile"] = r.get(
            "nvmlDeviceGetTotalEccErrors",
            handle,
            nv.NVML_MEMORY_ERROR_TYPE_CORRECTED,
            nv.NVML_VOLATILE_ECC,
        )
    pending = r.get("nvmlDeviceGetRetiredPagesPendingStatus", handle)
    f["retired_pages_pending"] = bool(pending) if pending is not None else None
    rows = r.get("nvmlDeviceGetRemappedRows", handle)
    if rows is not None:
        f["remapped_rows_pending"], f["remapped_rows_failure"] = bool(rows[2]), bool(rows[3])
    f["pcie_replay_count"] = r.get("nvmlDeviceGetPcieReplayCounter", handle)
    reasons = r.get("nvmlDeviceGetCurrentClocksEventReasons", handle)
    if reasons is None:
        reasons = r.get("nvmlDeviceGetCurrentClocksThrottleReasons", handle)
    if reasons is not None:
        f["throttle_reasons"] = tuple(
            name for bit, name in THROTTLE_REASONS.items() if reasons & bit
        )
    return f


def _read_detail(nv: Any, r: _Reader, handle: Any) -> dict[str, Any]:
    """What `status`, the exporter and the health watch show, and no choice depends on."""
    f: dict[str, Any] = {}
    f["temperature"] = r.get("nvmlDeviceGetTemperature", handle, nv.NVML_TEMPERATURE_GPU)
    power = r.get("nvmlDeviceGetPowerUsage", handle)
    f["power_draw"] = power / 1000.0 if power is not None else None
    limit = r.get("nvmlDeviceGetEnforcedPowerLimit", handle)
    f["power_limit"] = limit / 1000.0 if limit is not None else None
    energy = r.get("nvmlDeviceGetTotalEnergyConsumption", handle)
    f["energy_consumed"] = energy / 1000.0 if energy is not None else None
    f["fan_speed"] = r.get("nvmlDeviceGetFanSpeed", handle)
    f["clock_sm"] = r.get("nvmlDeviceGetClockInfo", handle, nv.NVML_CLOCK_SM)
    f["clock_sm_max"] = r.get("nvmlDeviceGetMaxClockInfo", handle, nv.NVML_CLOCK_SM)
    persistence = r.get("nvmlDeviceGetPersistenceMode", handle)
    f["persistence_mode"] = bool(persistence) if persistence is not None else None
    mode = r.get("nvmlDeviceGetComputeMode", handle)
    f["compute_mode"] = _COMPUTE_MODES.get(mode) if mode is not None else None
    return f


def _read_mig(nv: Any, r: _Reader, handle: Any) -> tuple[MigInstance, ...]:
    found = []
    for i in range(r.get("nvmlDeviceGetMaxMigDeviceCount", handle) or 0):
        mig = r.get("nvmlDeviceGetMigDeviceHandleByIndex", handle, i)
        if mig is None:
            continue
        name = r.get("nvmlDeviceGetName", mig)
        memory = r.get("nvmlDeviceGetMemoryInfo", mig)
        profile = _text(name).rsplit(" ", 1)[-1] if name is not None else None
        found.append(
            MigInstance(
                uuid=_text(nv.nvmlDeviceGetUUID(mig)),
                index=i,
                gpu_instance_id=r.get("nvmlDeviceGetGpuInstanceId", mig),
                compute_instance_id=r.get("nvmlDeviceGetComputeInstanceId", mig),
                name=profile,
                memory_total=int(memory.total) if memory is not None else None,
                memory_used=int(memory.used) if memory is not None else None,
            )
        )
    return tuple(found)
