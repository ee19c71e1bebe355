"""Counters only the exporter shows: dcgm-exporter's default counters that NVML gives.

Memory clock and temperature, encoder and decoder load, reserved memory, remapped
rows, PCIe throughput, and on Hopper and later the profiling ratios (graphics
engine, tensor pipes, DRAM) through NVML's GPU Performance Monitoring (GPM). No
choice of a GPU depends on them and `status` shows none, so `inventory` reads them
only when the exporter hands it a `Counters`, in the same NVML session as the rest
of the snapshot (`read_snapshot(counters=...)`), and `status` never loads this module.

Each value lands in `Gpu.counters` (or, per MIG instance, `MigInstance.counters`)
under a name of its own (`KEYS`); what NVML cannot answer for a card is left out,
never made up. GPM values are averages between two samples, so `Counters` keeps
each GPU's previous sample from one read to the next: the first read of a GPU has
no GPM values, each later one the average since the read before.
"""

from __future__ import annotations

from gpuwarden.base.records import replace

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any, Optional

    from gpuwarden.machine.inventory import Gpu, MigInstance

# name -> what it is (unit). The exporter maps these to dcgm-exporter's names.
KEYS = {
    "clock_mem": "memory clock (MHz)",
    "memory_temperature": "HBM temperature (Celsius)",
    "encoder_utilization": "encoder load (percent)",
    "decoder_utilization": "decoder load (percent)",
    "memory_reserved": "memory the driver reserves (bytes)",
    "remapped_rows_correctable": "rows remapped for correctable errors",
    "remapped_rows_uncorrectable": "rows remapped for uncorrectable errors",
    "pcie_tx_bytes_per_second": "PCIe bytes sent per second",
    "pcie_rx_bytes_per_second": "PCIe bytes received per second",
    "graphics_engine_active": "fraction of time the graphics/compute engine was busy (0-1)",
    "tensor_active": "fraction of time the SMs ran any tensor operation (0-1)",
    "dram_active": "fraction of DRAM bandwidth used (0-1)",
}

# GPM metric id (nvmlGpmMetricId_t) -> (key, factor to the key's unit). GPM gives
# percentages and MiB/s.
GPM_METRICS = {
    1: ("graphics_engine_active", 0.01),  # NVML_GPM_METRIC_GRAPHICS_UTIL
    5: ("tensor_active", 0.01),  # NVML_GPM_METRIC_ANY_TENSOR_UTIL
    10: ("dram_active", 0.01),  # NVML_GPM_METRIC_DRAM_BW_UTIL
    20: ("pcie_tx_bytes_per_second", 2.0**20),  # NVML_GPM_METRIC_PCIE_TX_PER_SEC
    21: ("pcie_rx_bytes_per_second", 2.0**20),  # NVML_GPM_METRIC_PCIE_RX_PER_SEC
}
# Per MIG instance, GPM gives the engine ratios; PCIe belongs to the whole GPU.
GPM_MIG_METRICS = (1, 5, 10)
NVML_FI_DEV_MEMORY_TEMP = 82  # nvmlDeviceGetFieldValues
KIB = 1024


class Counters:
    """Reads the counters of each GPU; keeps the previous GPM sample of each GPU and
    MIG instance between reads (one `Counters` per exporter)."""

    def __init__(self) -> None:
        self._samples: dict[tuple[str, Optional[int]], Any] = {}

    def read(self, nv: Any, get: Callable[..., Any], handle: Any, gpu: Gpu) -> Gpu:
        """`gpu` with its counters, and its MIG instances' (`get` is the inventory's
        NVML call that turns what a card cannot answer into None)."""
        found: dict[str, float] = {}
        clock = get("nvmlDeviceGetClockInfo", handle, getattr(nv, "NVML_CLOCK_MEM", 2))
        _put(found, "clock_mem", clock)
        _put(found, "memory_temperature", _field(nv, get, handle, NVML_FI_DEV_MEMORY_TEMP))
        for key, func in (
            ("encoder_utilization", "nvmlDeviceGetEncoderUtilization"),
            ("decoder_utilization", "nvmlDeviceGetDecoderUtilization"),
        ):
            answer = get(func, handle)  # (percent, sampling period in us)
            _put(found, key, answer[0] if answer is not None else None)
        if hasattr(nv, "nvmlMemory_v2"):
            memory = get("nvmlDeviceGetMemoryInfo", handle, nv.nvmlMemory_v2)
            _put(found, "memory_reserved", getattr(memory, "reserved", None))
        rows = get("nvmlDeviceGetRemappedRows", handle)  # (correctable, uncorrectable, ...)
        if rows is not None:
            _put(found, "remapped_rows_correctable", rows[0])
            _put(found, "remapped_rows_uncorrectable", rows[1])
        migs = gpu.mig_instances if gpu.mig_mode else ()
        if self._gpm_supported(nv, get, handle):
            found.update(self._gpm(nv, get, (gpu.uuid, None), handle, tuple(GPM_METRICS)))
            migs = tuple(
                replace(m, counters=tuple(sorted(self._gpm_mig(nv, get, gpu, handle, m).items())))
                for m in migs
            )
        if "pcie_tx_bytes_per_second" not in found:
            # 20 ms of sampling per call in the driver: only where GPM cannot say
            for key, which in (("pcie_tx_bytes_per_second", 0), ("pcie_rx_bytes_per_second", 1)):
                kib = get("nvmlDeviceGetPcieThroughput", handle, which)
                _put(found, key, None if kib is None else kib * KIB)
        fields: dict[str, Any] = {"counters": tuple(sorted(found.items()))}
        if migs:
            fields["mig_instances"] = migs
        return replace(gpu, **fields)

    def _gpm_supported(self, nv: Any, get: Callable[..., Any], handle: Any) -> bool:
        support = get("nvmlGpmQueryDeviceSupport", handle)
        return bool(getattr(support, "isSupportedDevice", 0))

    def _gpm_mig(
        self, nv: Any, get: Callable[..., Any], gpu: Gpu, handle: Any, mig: MigInstance
    ) -> dict[str, float]:
        if mig.gpu_instance_id is None:
            return {}
        key = (gpu.uuid, mig.gpu_instance_id)
        return self._gpm(nv, get, key, handle, GPM_MIG_METRICS, mig.gpu_instance_id)

    def _gpm(
        self,
        nv: Any,
        get: Callable[..., Any],
        key: tuple[str, Optional[int]],
        handle: Any,
        metric_ids: tuple[int, ...],
        instance: Optional[int] = None,
    ) -> dict[str, float]:
        """The GPM metrics between the previous sample of `key` and one taken now."""
        sample = get("nvmlGpmSampleAlloc")
        if sample is None:
            return {}
        if instance is None:
            taken = get("nvmlGpmSampleGet", handle, sample)
        else:
            taken = get("nvmlGpmMigSampleGet", handle, instance, sample)
        if taken is None:
            get("nvmlGpmSampleFree", sample)
            return {}
        previous = self._samples.pop(key, None)
        self._samples[key] = sample
        if previous is None:
            return {}
        try:
            return _gpm_values(nv, get, previous, sample, metric_ids)
        finally:
            get("nvmlGpmSampleFree", previous)


def _gpm_values(
    nv: Any, get: Callable[..., Any], first: Any, second: Any, metric_ids: tuple[int, ...]
) -> dict[str, float]:
    request = nv.c_nvmlGpmMetricsGet_t()
    request.version = nv.NVML_GPM_METRICS_GET_VERSION
    request.numMetrics = len(metric_ids)
    request.sample1, request.sample2 = first, second
    for i, metric in enumerate(metric_ids):
        request.metrics[i].metricId = metric
    answer = get("nvmlGpmMetricsGet", request)
    if answer is None:
        return {}
    found: dict[str, float] = {}
    for i, metric in enumerate(metric_ids):
        entry = answer.metrics[i]
        if entry.nvmlReturn == 0:  # NVML_SUCCESS; per metric, NotSupported is left out
            name, factor = GPM_METRICS[metric]
            found[name] = float(entry.value) * factor
    return found


def _field(nv: Any, get: Callable[..., Any], handle: Any, field_id: int) -> Optional[float]:
    """One value of nvmlDeviceGetFieldValues, None when the driver has none for the card."""
    values = get("nvmlDeviceGetFieldValues", handle, [field_id])
    if not values or values[0].nvmlReturn != 0:
        return None
    entry = values[0]
    kind = {0: "dVal", 1: "uiVal", 2: "ulVal", 3: "ullVal", 4: "sllVal", 5: "siVal"}
    return float(getattr(entry.value, kind.get(int(entry.valueType), "uiVal")))


def _put(found: dict[str, float], key: str, value: Any) -> None:
    if value is not None:
        found[key] = float(value)
