"""dcgm-exporter's names, units and labels, so dashboards built for it work unchanged.

With `exporter.dcgm_compat`, `metrics.families` adds these: every default counter of
dcgm-exporter (its etc/default-counters.csv) that NVML gives, plus the few more
gpuwarden always had (FB_TOTAL, power limit, fan, volatile ECC, retired pages).
Labels as current dcgm-exporter writes them: `gpu`, `UUID`, `pci_bus_id`, `device`,
`modelName`, `hostname` (it was `Hostname` before 3.3), and `DCGM_FI_DRIVER_VERSION`.

On a GPU in MIG mode, what NVML gives per MIG instance (memory; on Hopper and later
the GPM engine ratios) is one series per instance with dcgm-exporter's
`GPU_I_PROFILE` and `GPU_I_ID` labels, and none for the whole GPU, as dcgm-exporter
does; what NVML gives only for the whole GPU (temperature, power, clocks) is one
series without them. NVML has no utilization per MIG instance (nor for a GPU in MIG
mode), so DCGM_FI_DEV_GPU_UTIL is absent there rather than made up.

Pure, like `metrics`: a `View` in, prometheus_client metric families out.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Optional

from gpuwarden.machine.inventory import Gpu, MigInstance

MIB = 2**20


def _counter(key: str, factor: float = 1.0) -> Callable[[Any], Optional[float]]:
    """A value from `Gpu.counters` / `MigInstance.counters` (`counters.KEYS`)."""

    def value(item: Any) -> Optional[float]:
        found = dict(item.counters).get(key)
        return None if found is None else found * factor

    return value


def _mib(attr: str) -> Callable[[Any], Optional[float]]:
    def value(item: Any) -> Optional[float]:
        found = getattr(item, attr)
        return None if found is None else found / MIB

    return value


def _flag(attr: str) -> Callable[[Gpu], Optional[float]]:
    def value(gpu: Gpu) -> Optional[float]:
        found = getattr(gpu, attr)
        return None if found is None else float(int(found))

    return value


def _mig_free(mig: MigInstance) -> Optional[float]:
    if mig.memory_total is None or mig.memory_used is None:
        return None
    return max(0, mig.memory_total - mig.memory_used) / MIB


# (name, help, type, value of the whole GPU), as dcgm-exporter defines them
PER_GPU: Sequence[tuple[str, str, str, Callable[[Gpu], Optional[float]]]] = (
    ("DCGM_FI_DEV_SM_CLOCK", "SM clock frequency (in MHz).", "gauge", lambda g: g.clock_sm),
    ("DCGM_FI_DEV_MEM_CLOCK", "Memory clock frequency (in MHz).", "gauge", _counter("clock_mem")),
    (
        "DCGM_FI_DEV_MEMORY_TEMP",
        "Memory temperature (in C).",
        "gauge",
        _counter("memory_temperature"),
    ),
    ("DCGM_FI_DEV_GPU_TEMP", "GPU temperature (in C).", "gauge", lambda g: g.temperature),
    ("DCGM_FI_DEV_POWER_USAGE", "Power draw (in W).", "gauge", lambda g: g.power_draw),
    (
        "DCGM_FI_DEV_POWER_MGMT_LIMIT",
        "Power management limit (in W).",
        "gauge",
        lambda g: g.power_limit,
    ),
    (
        "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
        "Total energy consumption since boot (in mJ).",
        "counter",
        lambda g: None if g.energy_consumed is None else g.energy_consumed * 1000.0,
    ),
    (
        "DCGM_FI_DEV_PCIE_REPLAY_COUNTER",
        "Total number of PCIe retries.",
        "counter",
        lambda g: g.pcie_replay_count,
    ),
    ("DCGM_FI_DEV_GPU_UTIL", "GPU utilization (in %).", "gauge", lambda g: g.utilization_gpu),
    (
        "DCGM_FI_DEV_MEM_COPY_UTIL",
        "Memory utilization (in %).",
        "gauge",
        lambda g: g.utilization_memory,
    ),
    (
        "DCGM_FI_DEV_ENC_UTIL",
        "Encoder utilization (in %).",
        "gauge",
        _counter("encoder_utilization"),
    ),
    (
        "DCGM_FI_DEV_DEC_UTIL",
        "Decoder utilization (in %).",
        "gauge",
        _counter("decoder_utilization"),
    ),
    ("DCGM_FI_DEV_FB_FREE", "Framebuffer memory free (in MiB).", "gauge", _mib("memory_free")),
    ("DCGM_FI_DEV_FB_USED", "Framebuffer memory used (in MiB).", "gauge", _mib("memory_used")),
    ("DCGM_FI_DEV_FB_TOTAL", "Framebuffer memory total (in MiB).", "gauge", _mib("memory_total")),
    (
        "DCGM_FI_DEV_FB_RESERVED",
        "Framebuffer memory reserved (in MiB).",
        "gauge",
        _counter("memory_reserved", 1 / MIB),
    ),
    ("DCGM_FI_DEV_FAN_SPEED", "Fan speed (in %).", "gauge", lambda g: g.fan_speed),
    (
        "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL",
        "Total number of single-bit volatile ECC errors.",
        "counter",
        lambda g: g.ecc_corrected_volatile,
    ),
    (
        "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",
        "Total number of double-bit volatile ECC errors.",
        "counter",
        lambda g: g.ecc_uncorrected_volatile,
    ),
    (
        "DCGM_FI_DEV_RETIRED_PENDING",
        "Number of pages pending retirement.",
        "gauge",
        _flag("retired_pages_pending"),
    ),
    (
        "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS",
        "Number of remapped rows for uncorrectable errors",
        "counter",
        _counter("remapped_rows_uncorrectable"),
    ),
    (
        "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS",
        "Number of remapped rows for correctable errors",
        "counter",
        _counter("remapped_rows_correctable"),
    ),
    (
        "DCGM_FI_DEV_ROW_REMAP_FAILURE",
        "Whether remapping of rows has failed",
        "gauge",
        _flag("remapped_rows_failure"),
    ),
    (
        "DCGM_FI_PROF_GR_ENGINE_ACTIVE",
        "Ratio of time the graphics engine is active.",
        "gauge",
        _counter("graphics_engine_active"),
    ),
    (
        "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",
        "Ratio of cycles the tensor (HMMA) pipe is active.",
        "gauge",
        _counter("tensor_active"),
    ),
    (
        "DCGM_FI_PROF_DRAM_ACTIVE",
        "Ratio of cycles the device memory interface is active sending or receiving data.",
        "gauge",
        _counter("dram_active"),
    ),
    (
        "DCGM_FI_PROF_PCIE_TX_BYTES",
        "The rate of data transmitted over the PCIe bus - including both protocol headers "
        "and data payloads - in bytes per second.",
        "gauge",
        _counter("pcie_tx_bytes_per_second"),
    ),
    (
        "DCGM_FI_PROF_PCIE_RX_BYTES",
        "The rate of data received over the PCIe bus - including both protocol headers "
        "and data payloads - in bytes per second.",
        "gauge",
        _counter("pcie_rx_bytes_per_second"),
    ),
)

#: Counters under dcgm-exporter's exact names (no `_total`). prometheus-client appends
#: `_total` to a counter's name, so these families are built untyped and typed in the
#: text body (`typed`), `# TYPE NAME counter` as dcgm-exporter writes them. OpenMetrics
#: requires a counter's samples to end in `_total`: in that format they stay unknown.
COUNTERS = tuple(name for name, _, kind, _ in PER_GPU if kind == "counter")
_RETYPED = tuple(
    (f"# TYPE {name} untyped\n".encode(), f"# TYPE {name} counter\n".encode()) for name in COUNTERS
)


def typed(body: bytes) -> bytes:
    """A Prometheus text body (format 0.0.4) with the COUNTERS typed as counters."""
    for untyped, counter in _RETYPED:
        body = body.replace(untyped, counter, 1)
    return body


# What NVML gives per MIG instance: on a GPU in MIG mode these are per instance only.
PER_INSTANCE: dict[str, Callable[[MigInstance], Optional[float]]] = {
    "DCGM_FI_DEV_FB_USED": _mib("memory_used"),
    "DCGM_FI_DEV_FB_FREE": _mig_free,
    "DCGM_FI_DEV_FB_TOTAL": _mib("memory_total"),
    "DCGM_FI_PROF_GR_ENGINE_ACTIVE": _counter("graphics_engine_active"),
    "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": _counter("tensor_active"),
    "DCGM_FI_PROF_DRAM_ACTIVE": _counter("dram_active"),
}


def labels(gpu: Gpu, hostname: str, driver: Optional[str]) -> dict[str, str]:
    """dcgm-exporter's labels of a whole GPU, in its order."""
    return {
        "gpu": str(gpu.index),
        "UUID": gpu.uuid,
        "pci_bus_id": gpu.pci_bus_id or "",
        "device": f"nvidia{gpu.index}",
        "modelName": gpu.name or "",
        "hostname": hostname,
        "DCGM_FI_DRIVER_VERSION": driver or "",
    }


def mig_slot(mig: MigInstance) -> tuple[str, str]:
    """GPU_I_ID and GPU_I_PROFILE of a MIG instance, as dcgm-exporter writes them;
    gpuwarden's own per-instance series carry them too."""
    return ("" if mig.gpu_instance_id is None else str(mig.gpu_instance_id), mig.name or "")


def instance_labels(base: dict[str, str], mig: MigInstance) -> dict[str, str]:
    """A MIG instance's: the parent's, plus its profile and GPU instance id, as
    dcgm-exporter names them (`UUID` stays the parent's, as there)."""
    gi, profile = mig_slot(mig)
    return {**base, "GPU_I_PROFILE": profile, "GPU_I_ID": gi}


def families(view: Any) -> list:
    """The DCGM_FI_* families of one `metrics.View`."""
    from prometheus_client import Metric

    snap = view.snapshot
    out = []
    for name, doc, kind, attr in PER_GPU:
        # dcgm-exporter keeps counter names without `_total`; prometheus-client would
        # add it to a counter, so those are exposed untyped under the exact name.
        fam = Metric(name, doc, "gauge" if kind == "gauge" else "unknown")
        per_instance = PER_INSTANCE.get(name)
        for gpu in snap.gpus:
            if gpu.lost:
                continue
            base = labels(gpu, snap.hostname, snap.driver_version)
            if per_instance is not None and gpu.mig_mode and gpu.mig_instances:
                for mig in gpu.mig_instances:
                    value = per_instance(mig)
                    if value is not None:
                        fam.add_sample(name, instance_labels(base, mig), float(value))
                continue
            value = attr(gpu)
            if value is not None:
                fam.add_sample(name, base, float(value))
        out.append(fam)
    xid = Metric("DCGM_FI_DEV_XID_ERRORS", "Value of the last XID error encountered.", "gauge")
    for gpu in snap.gpus:
        seen = view.xids.get(gpu.uuid, ())
        last = seen[-1] if seen else 0
        found = {**labels(gpu, snap.hostname, snap.driver_version), **_xid_labels(last)}
        xid.add_sample("DCGM_FI_DEV_XID_ERRORS", found, float(last))
    out.append(xid)
    return out


def _xid_labels(xid: int) -> dict[str, str]:
    """`err_code` and `err_msg`, as dcgm-exporter labels its last XID: the text is the
    description in NVIDIA's Xid catalogue (gpuwarden.health.xids)."""
    from gpuwarden.health.xids import XID_CATALOGUE

    known = XID_CATALOGUE.get(xid)
    text = "No Error" if xid == 0 else known.description if known else "Unknown Error"
    return {"err_code": str(xid), "err_msg": text}
