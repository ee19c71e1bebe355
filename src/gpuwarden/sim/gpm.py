"""GPU Performance Monitoring (GPM): the profiling counters of Hopper and later.

`nvmlGpmSampleGet` takes a sample of a GPU (`nvmlGpmMigSampleGet` of one MIG GPU
instance) and `nvmlGpmMetricsGet` turns two samples into metrics: tensor-core, SM
and DRAM activity, SM occupancy, PCIe and NVLink bandwidth; dcgm-exporter's
`DCGM_FI_PROF_*` counters are these. Only an exporter asks, so
`library.FakeLibrary` loads this module when one of its functions is first looked up.

As in the driver, a card before Hopper says `isSupportedDevice = 0` and refuses a
sample with NVML_ERROR_NOT_SUPPORTED. A metric is the mean over the two samples of
what the simulated load gives at each (a training job's mix: tensor cores busy
about half the time the GPU is, DRAM as busy as the memory-utilization figure);
PCIe follows `pcie.traffic`, NVLink `links.link_traffic`.
"""

from __future__ import annotations

import time

from gpuwarden.sim.abi import (
    ARGUMENT_VERSION_MISMATCH,
    INVALID_ARGUMENT,
    NOT_FOUND,
    NOT_SUPPORTED,
    SUCCESS,
    address,
    obj,
    put_pointer,
    val,
)
from gpuwarden.sim.board import HOPPER, architecture
from gpuwarden.sim.links import link_traffic
from gpuwarden.sim.pcie import traffic
from gpuwarden.sim.state import live_processes, utilization

TYPE_CHECKING = False  # typing stays off the start-up path; annotations need it only here
if TYPE_CHECKING:
    from typing import Any, Optional

SAMPLE_BASE = 0x47504D000000  # "GPM": sample handles are opaque pointers never dereferenced
METRIC_MAX = 477  # NVML_GPM_METRIC_MAX: the length of the metrics array
VERSION = 1  # NVML_GPM_METRICS_GET_VERSION and NVML_GPM_SUPPORT_VERSION
MiB = 2**20

# Metric id -> (share of the GPU's load, short name, long name, unit): the load-driven ones.
LOAD_METRICS = {
    1: (1.0, b"gr_util", b"Graphics/compute engine activity", b"%"),
    2: (0.9, b"sm_util", b"SM activity", b"%"),
    3: (0.5, b"sm_occupancy", b"SM occupancy", b"%"),
    4: (0.1, b"integer_util", b"Integer pipe activity", b"%"),
    5: (0.45, b"any_tensor_util", b"Tensor pipe activity (any)", b"%"),
    6: (0.0, b"dfma_tensor_util", b"DFMA tensor pipe activity", b"%"),
    7: (0.45, b"hmma_tensor_util", b"HMMA tensor pipe activity", b"%"),
    8: (0.0, b"dmma_tensor_util", b"DMMA tensor pipe activity", b"%"),
    9: (0.0, b"imma_tensor_util", b"IMMA tensor pipe activity", b"%"),
    11: (0.0, b"fp64_util", b"FP64 pipe activity", b"%"),
    12: (0.2, b"fp32_util", b"FP32 pipe activity", b"%"),
    13: (0.05, b"fp16_util", b"FP16 pipe activity", b"%"),
}
DRAM_BW_UTIL, PCIE_TX, PCIE_RX, NVLINK_RX, NVLINK_TX = 10, 20, 21, 60, 61
NVLINK_PER_LINK = range(62, 98)  # L0 RX, L0 TX, ... L17 TX
# Video engines of a Hopper board: 7 NVDEC, 7 NVJPG, 1 NVOFA; idle in a training job.
IDLE_ENGINES = {*range(30, 37), *range(40, 47), 50}


def _instance_load(state: dict[str, Any], gpu: dict[str, Any], mig: dict[str, Any]) -> float:
    """A MIG instance's load: the GPU's figure while a process runs in it, else idle."""
    busy = any(
        p["gpu"] == gpu["uuid"] and p.get("mig") == mig["index"] for p in live_processes(state)
    )
    return float(utilization(state, gpu)) if busy else 0.0


def snapshot(
    state: dict[str, Any], gpu: dict[str, Any], mig: Optional[dict[str, Any]]
) -> dict[int, float]:
    """Every metric's value at this instant, for the whole GPU or one MIG instance."""
    load = utilization(state, gpu) if mig is None else _instance_load(state, gpu, mig)
    values = {metric: share * load for metric, (share, *_) in LOAD_METRICS.items()}
    values[DRAM_BW_UTIL] = float(gpu["memory_utilization"]) if load else 0.0
    values.update(dict.fromkeys(IDLE_ENGINES, 0.0))
    if mig is None:
        tx, rx = traffic(state, gpu)
        values[PCIE_TX], values[PCIE_RX] = tx / MiB, rx / MiB
        links, per_link_bytes = link_traffic(state, gpu)
        per_link = per_link_bytes / MiB
        values[NVLINK_RX] = values[NVLINK_TX] = per_link * links
        for n in range(links):
            values[62 + 2 * n] = values[63 + 2 * n] = per_link
    return values


_NAMES = {
    DRAM_BW_UTIL: (b"dram_bw_util", b"DRAM bandwidth utilization", b"%"),
    PCIE_TX: (b"pcie_tx", b"PCIe transmit bandwidth", b"MiB/sec"),
    PCIE_RX: (b"pcie_rx", b"PCIe receive bandwidth", b"MiB/sec"),
    NVLINK_RX: (b"nvlink_total_rx", b"NVLink receive bandwidth, all links", b"MiB/sec"),
    NVLINK_TX: (b"nvlink_total_tx", b"NVLink transmit bandwidth, all links", b"MiB/sec"),
}


def _info(metric: int) -> tuple[bytes, bytes, bytes]:
    if metric in LOAD_METRICS:
        return LOAD_METRICS[metric][1:]
    if metric in _NAMES:
        return _NAMES[metric]
    if metric in NVLINK_PER_LINK:
        n, tx = divmod(metric - 62, 2)
        way = b"tx" if tx else b"rx"
        return b"nvlink_l%d_%s" % (n, way), b"NVLink link %d bandwidth" % n, b"MiB/sec"
    return b"engine_util", b"Video engine activity", b"%"


def _take(
    samples: dict[int, Optional[dict[str, Any]]],
    state: dict[str, Any],
    gpu: dict[str, Any],
    mig: Optional[dict[str, Any]],
    sample: Any,
) -> int:
    """Fill an allocated sample with this instant's metrics of the GPU or MIG instance."""
    where = address(sample) or 0
    if where not in samples:
        return INVALID_ARGUMENT
    if architecture(gpu) < HOPPER:
        return NOT_SUPPORTED
    samples[where] = {
        "gpu": gpu["uuid"],
        "instance": None if mig is None else mig["gpu_instance_id"],
        "time": time.monotonic(),
        "values": snapshot(state, gpu, mig),
    }
    return SUCCESS


class Gpm:
    """NVML's GPM functions, as methods of `FakeLibrary`."""

    gpm_samples: dict[int, Optional[dict[str, Any]]]

    def nvmlGpmQueryDeviceSupport(self, state: Any, gpu: Any, mig: Any, ref: Any) -> int:
        support = obj(ref)
        if support.version != VERSION:
            return ARGUMENT_VERSION_MISMATCH
        support.isSupportedDevice = 1 if architecture(gpu) >= HOPPER else 0
        return SUCCESS

    def nvmlGpmSampleAlloc(self, out: Any) -> None:
        where = max(self.gpm_samples, default=SAMPLE_BASE) + 0x10
        self.gpm_samples[where] = None  # allocated, not yet taken
        put_pointer(out, where)

    def nvmlGpmSampleFree(self, sample: Any) -> int:
        if self.gpm_samples.pop(address(sample) or 0, False) is False:
            return INVALID_ARGUMENT
        return SUCCESS

    def nvmlGpmSampleGet(self, state: Any, gpu: Any, mig: Any, sample: Any) -> int:
        return _take(self.gpm_samples, state, gpu, None, sample)

    def nvmlGpmMigSampleGet(
        self, state: Any, gpu: Any, mig: Any, instance_id: Any, sample: Any
    ) -> int:
        if architecture(gpu) < HOPPER:
            return NOT_SUPPORTED
        if not gpu.get("mig"):
            return INVALID_ARGUMENT
        wanted = val(instance_id)
        for instance in gpu["mig_instances"]:
            if instance["gpu_instance_id"] == wanted:
                return _take(self.gpm_samples, state, gpu, instance, sample)
        return NOT_FOUND

    def nvmlGpmMetricsGet(self, ref: Any) -> int:
        request = obj(ref)
        if request.version != VERSION:
            return ARGUMENT_VERSION_MISMATCH
        first = self.gpm_samples.get(address(request.sample1) or 0)
        second = self.gpm_samples.get(address(request.sample2) or 0)
        if first is None or second is None or request.numMetrics > METRIC_MAX:
            return INVALID_ARGUMENT
        same = (first["gpu"], first["instance"]) == (second["gpu"], second["instance"])
        if not same or second["time"] < first["time"]:
            return INVALID_ARGUMENT  # two samples of one device, the second taken later
        for i in range(request.numMetrics):
            metric = request.metrics[i]
            a = first["values"].get(metric.metricId)
            b = second["values"].get(metric.metricId)
            if a is None or b is None:
                metric.nvmlReturn = NOT_SUPPORTED
                continue
            metric.nvmlReturn = SUCCESS
            metric.value = (a + b) / 2
            short, long, unit = _info(metric.metricId)
            metric.metricInfo.shortName = short
            metric.metricInfo.longName = long
            metric.metricInfo.unit = unit
        return SUCCESS
