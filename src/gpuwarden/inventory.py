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

from dataclasses import dataclass, field
from typing import Optional

# Topology levels as NVML reports them (nvmlGpuTopologyLevel_t); lower is closer.
TOPOLOGY_INTERNAL = 0  # the same board (multi-GPU card)
TOPOLOGY_SINGLE = 10  # one PCIe switch between them
TOPOLOGY_MULTIPLE = 20  # several PCIe switches, no host bridge
TOPOLOGY_HOSTBRIDGE = 30  # the same host bridge
TOPOLOGY_NODE = 40  # the same NUMA node
TOPOLOGY_SYSTEM = 50  # across NUMA nodes (SMP interconnect)


@dataclass(frozen=True)
class GpuProcess:
    """A process holding a context on a GPU (NVML's compute or graphics list)."""

    pid: int
    used_memory: Optional[int]  # bytes; None when NVML does not say (e.g. under MIG)
    user: Optional[str] = None
    command: Optional[str] = None
    kind: str = "compute"  # "compute" or "graphics"
    mig_uuid: Optional[str] = None  # the MIG instance it runs in, if any


@dataclass(frozen=True)
class MigInstance:
    """A MIG device carved out of a physical GPU; CUDA sees it as its own device."""

    uuid: str  # "MIG-..."
    index: int  # MIG device index within the parent
    gpu_instance_id: Optional[int] = None
    compute_instance_id: Optional[int] = None
    name: Optional[str] = None  # profile, e.g. "1g.10gb"
    memory_total: Optional[int] = None
    memory_used: Optional[int] = None


@dataclass(frozen=True)
class Gpu:
    """One physical GPU as NVML saw it at `Snapshot.taken_at`.

    `index` is NVML's index: PCI bus order, the number nvidia-smi prints.
    Identity is `uuid`; indices are presentation only.
    """

    index: int
    uuid: str
    name: Optional[str] = None
    pci_bus_id: Optional[str] = None
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
    lost: bool = False  # NVML said GpuIsLost (fallen off the bus)
    error: Optional[str] = None  # why the GPU could not be read, when lost or broken


@dataclass(frozen=True)
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


def load_nvml():  # -> ModuleType
    """The pynvml-like module to read: the simulator's when GPUWARDEN_SIM is set, else
    nvidia-ml-py's `pynvml`. Raises ImportError when neither can be had."""
    raise NotImplementedError  # filled in by the inventory work


def read_snapshot(nvml=None, *, processes: bool = True, topology: bool = False) -> Snapshot:
    """Read the machine once. `nvml` defaults to `load_nvml()`; never raises for
    hardware conditions (see the module docstring)."""
    raise NotImplementedError  # filled in by the inventory work
