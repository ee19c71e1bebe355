"""Prometheus metric families for GPUs, processes, users, leases, drains and health.

`families()` turns a `View` (one moment's snapshot plus leases, drains,
findings, XIDs and idle times) into metric families and is pure, so every
series can be tested on hand-built snapshots; `server` reads the views and
serves them.

Names follow Prometheus conventions: base units (bytes, seconds, watts,
joules, hertz, ratios 0-1) in the name, counters end in `_total`. Labels on
every GPU series: `gpu` (the nvidia-smi index), `uuid`, `model`, `hostname`.
With `dcgm_compat`, dcgm-exporter's names, units and labels are emitted too
(`dcgm`), for dashboards built for dcgm-exporter (Grafana 12239).

A series that alerts take the increase() of must exist at 0 before its first
event (Prometheus sees no increase in a series born at 1): hence the per-GPU
`gpuwarden_gpu_xid_events_total{fatal}` beside the per-code XID counters.

prometheus-client is the `exporter` extra, imported inside the functions.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any, Optional

from gpuwarden.base.records import field, record
from gpuwarden.exporter.dcgm import families as dcgm_families
from gpuwarden.exporter.dcgm import mig_slot
from gpuwarden.exporter.queue import families as queue_families
from gpuwarden.health.judgement import DEFAULT_FATAL_XIDS, OK, Symptom, level
from gpuwarden.machine.inventory import Gpu, Snapshot

LEVELS = ("ok", "warning", "fatal")
WHOLE = ("", "")  # GPU_I_ID and GPU_I_PROFILE of a whole GPU


@record
class View:
    """Everything one scrape reports, read at one moment."""

    snapshot: Snapshot
    leases: tuple = ()  # LeaseInfo
    drains: Mapping[str, Any] = field(default_factory=dict)  # uuid -> Drain
    findings: Mapping[str, tuple[Symptom, ...]] = field(default_factory=dict)
    xids: Mapping[str, tuple[int, ...]] = field(default_factory=dict)
    fatal_xids: frozenset = DEFAULT_FATAL_XIDS  # health.fatal_xids, for the `fatal` label
    idle_seconds: Mapping[str, float] = field(default_factory=dict)  # held-while-idle time
    idle_after: float = 600.0  # seconds of idle-held before `gpuwarden_gpu_idle_held` is 1
    scrape_errors: int = 0
    read_seconds: float = 0.0
    nvml_up: bool = True
    queue: Optional[Mapping[str, Any]] = None  # the queue service's `stats`; None: no service
    # Processes' command lines in the `command` label: off unless the admin says so, as
    # anyone who can reach the port reads them (`exporter.show_commands`).
    show_commands: bool = False


def held(gpu: Gpu, leased: bool) -> bool:
    """Someone has the GPU: a lease, or a process holding memory on it."""
    return leased or any(p.kind == "compute" or p.used_memory for p in gpu.processes)


def is_idle(gpu: Gpu, idle_util: float) -> bool:
    return gpu.utilization_gpu is not None and gpu.utilization_gpu <= idle_util


class IdleTracker:
    """How long each GPU has been held while idle (the waste admins want to see)."""

    def __init__(self, idle_util: float = 1.0) -> None:
        self.idle_util = idle_util
        self._since: dict[str, float] = {}

    def update(self, snapshot: Snapshot, leased: Iterable[str]) -> dict[str, float]:
        leased = set(leased)
        now = snapshot.taken_at
        result: dict[str, float] = {}
        for gpu in snapshot.gpus:
            if not gpu.lost and held(gpu, gpu.uuid in leased) and is_idle(gpu, self.idle_util):
                since = self._since.setdefault(gpu.uuid, now)
                result[gpu.uuid] = max(0.0, now - since)
            else:
                self._since.pop(gpu.uuid, None)
                result[gpu.uuid] = 0.0
        return result


def _ratio(percent: Optional[float]) -> Optional[float]:
    return None if percent is None else percent / 100.0


class Scrape:
    """One scrape being turned into families: the view, its GPUs' labels, and
    prometheus_client's two family types (imported when the first scrape is made)."""

    def __init__(self, view: View) -> None:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        self.view = view
        self.gpus = view.snapshot.gpus
        self.host = view.snapshot.hostname
        self.base = ["gpu", "uuid", "model", "hostname"]
        self.Gauge = GaugeMetricFamily
        self.Counter = CounterMetricFamily

    def labels(self, gpu: Gpu) -> list[str]:
        return [str(gpu.index), gpu.uuid, gpu.name or "", self.host]


#: One part of a scrape: its families, in the order they are exposed.
Part = Callable[[Scrape], list]


def per_gpu(
    name: str, doc: str, value: Callable[[Gpu], Optional[float]], counter: bool = False
) -> Part:
    """A family of one series per GPU with the base labels, from one of the GPU's fields
    (a GPU whose field is None has no series)."""

    def part(s: Scrape) -> list:
        fam = (s.Counter if counter else s.Gauge)(name, doc, labels=s.base)
        for gpu in s.gpus:
            got = value(gpu)
            if got is not None:
                fam.add_metric(s.labels(gpu), float(got))
        return [fam]

    return part


def _info(s: Scrape) -> list:
    info = s.Gauge(
        "gpuwarden_gpu_info",
        "GPU identity (always 1)",
        labels=[*s.base, "pci_bus_id", "driver_version"],
    )
    driver = s.view.snapshot.driver_version or ""
    for gpu in s.gpus:
        info.add_metric([*s.labels(gpu), gpu.pci_bus_id or "", driver], 1)
    return [info]


def _ecc(s: Scrape) -> list:
    ecc = s.Counter(
        "gpuwarden_gpu_ecc_errors",
        "ECC errors since the driver loaded (volatile)",
        labels=[*s.base, "type"],
    )
    for gpu in s.gpus:
        for kind, value in (
            ("corrected", gpu.ecc_corrected_volatile),
            ("uncorrected", gpu.ecc_uncorrected_volatile),
        ):
            if value is not None:
                ecc.add_metric([*s.labels(gpu), kind], value)
    return [ecc]


def _throttled(s: Scrape) -> list:
    throttle = s.Gauge(
        "gpuwarden_gpu_throttled",
        "1 for each active clock throttle reason",
        labels=[*s.base, "reason"],
    )
    for gpu in s.gpus:
        for why in gpu.throttle_reasons or ():
            throttle.add_metric([*s.labels(gpu), why], 1)
    return [throttle]


def _xids(s: Scrape) -> list:
    """Per code, the series is born with the first event, already at 1: Prometheus's
    increase() cannot see that first step. The per-GPU `xid_events` counters are
    exported at 0 from the start, so alerts and panels use those for "new XID"."""
    xid_total = s.Counter(
        "gpuwarden_gpu_xid_errors",
        "XID errors seen since boot (or since `gpuwarden health --clear`), per code; "
        "fatal per health.fatal_xids",
        labels=[*s.base, "xid", "fatal"],
    )
    xid_events = s.Counter(
        "gpuwarden_gpu_xid_events",
        "XID errors on the GPU, fatal (per health.fatal_xids) or not; both series "
        "exist at 0 before the first, so increase() sees it",
        labels=[*s.base, "fatal"],
    )
    last_xid = s.Gauge(
        "gpuwarden_gpu_last_xid", "The most recent XID on the GPU (0: none)", labels=s.base
    )
    for gpu in s.gpus:
        seen = s.view.xids.get(gpu.uuid, ())
        fatal_count = 0
        for xid in sorted(set(seen)):
            count = seen.count(xid)
            fatal = xid in s.view.fatal_xids
            fatal_count += count if fatal else 0
            xid_total.add_metric([*s.labels(gpu), str(xid), _bool(fatal)], count)
        xid_events.add_metric([*s.labels(gpu), "true"], fatal_count)
        xid_events.add_metric([*s.labels(gpu), "false"], len(seen) - fatal_count)
        last_xid.add_metric(s.labels(gpu), seen[-1] if seen else 0)
    return [xid_total, xid_events, last_xid]


def _health(s: Scrape) -> list:
    health = s.Gauge(
        "gpuwarden_gpu_health",
        "1 for the GPU's health state (ok, warning, fatal), 0 for the others",
        labels=[*s.base, "state"],
    )
    reason = s.Gauge(
        "gpuwarden_gpu_health_finding",
        "One series per current health finding",
        labels=[*s.base, "level", "code", "reason"],
    )
    for gpu in s.gpus:
        found = tuple(s.view.findings.get(gpu.uuid, ()))
        state = level(found) if found else OK
        for name in LEVELS:
            health.add_metric([*s.labels(gpu), name], int(name == state))
        for f in found:
            reason.add_metric([*s.labels(gpu), f.level, f.code, f.reason], 1)
    return [health, reason]


def _drained(s: Scrape) -> list:
    drained = s.Gauge(
        "gpuwarden_gpu_drained",
        "1 when the GPU is taken out of service",
        labels=[*s.base, "reason", "by", "auto"],
    )
    for gpu in s.gpus:
        d = s.view.drains.get(gpu.uuid)
        if d is None:
            drained.add_metric([*s.labels(gpu), "", "", ""], 0)
        else:
            drained.add_metric(
                [
                    *s.labels(gpu),
                    str(getattr(d, "reason", "")),
                    str(getattr(d, "drainer", "")),
                    _bool(getattr(d, "auto", False)),
                ],
                1,
            )
    return [drained]


#: A GPU in MIG mode is leased, and holds processes, per MIG instance: those series
#: carry dcgm-exporter's GPU_I_ID and GPU_I_PROFILE (empty for a whole GPU).
SLOTS = ["GPU_I_ID", "GPU_I_PROFILE"]


def _leased(s: Scrape) -> list:
    leased = s.Gauge(
        "gpuwarden_gpu_leased",
        "1 per lease held on the GPU or MIG instance (0 with empty user when none)",
        labels=[*s.base, *SLOTS, "user", "job", "pid"],
    )
    by_uuid: dict[str, list] = {}
    for lease in s.view.leases:
        by_uuid.setdefault(lease.uuid, []).append(lease)
    for gpu in s.gpus:
        units = _units(gpu)
        if units[0][0] != gpu.uuid and gpu.uuid in by_uuid:
            units.append((gpu.uuid, WHOLE))  # a lease on the whole of a MIG-mode GPU
        for uuid, slot in units:
            leases = by_uuid.get(uuid, [])
            if not leases:
                leased.add_metric([*s.labels(gpu), *slot, "", "", ""], 0)
            for lease in leases:
                # lease files are written by other users: every label is made a string
                # here, so one record of the wrong type cannot fail the whole scrape
                job = _short(lease.job, 60) or (
                    _short(lease.command, 60) if s.view.show_commands else ""
                )
                user = _short(lease.user, 60)
                pid = _short(lease.pid, 20)
                leased.add_metric([*s.labels(gpu), *slot, user, job, pid], 1)
    return [leased]


def _mig_memory(s: Scrape) -> list:
    mig_labels = [*s.base, *SLOTS, "mig_uuid"]
    mig_used = s.Gauge(
        "gpuwarden_mig_memory_used_bytes", "Memory in use on a MIG instance", labels=mig_labels
    )
    mig_total = s.Gauge(
        "gpuwarden_mig_memory_total_bytes", "Memory of a MIG instance", labels=mig_labels
    )
    for gpu in s.gpus:
        for mig in gpu.mig_instances if gpu.mig_mode else ():
            names = [*s.labels(gpu), *mig_slot(mig), mig.uuid]
            for fam, value in ((mig_used, mig.memory_used), (mig_total, mig.memory_total)):
                if value is not None:
                    fam.add_metric(names, value)
    return [mig_used, mig_total]


def _idle(s: Scrape) -> list:
    after = s.view.idle_after
    idle_held = s.Gauge(
        "gpuwarden_gpu_idle_held",
        f"1 when the GPU is leased or holds memory but has been idle {after:g}s or more",
        labels=s.base,
    )
    idle_secs = s.Gauge(
        "gpuwarden_gpu_idle_held_seconds",
        "How long the GPU has been held while idle",
        labels=s.base,
    )
    for gpu in s.gpus:
        secs = s.view.idle_seconds.get(gpu.uuid, 0.0)
        idle_held.add_metric(s.labels(gpu), int(secs >= after and secs > 0))
        idle_secs.add_metric(s.labels(gpu), secs)
    return [idle_held, idle_secs]


def _processes(s: Scrape) -> list:
    procs = s.Gauge(
        "gpuwarden_process_memory_used_bytes",
        "GPU memory held by one process",
        labels=[*s.base, *SLOTS, "pid", "user", "command"],
    )
    per_user: dict[str, float] = {}
    for gpu in s.gpus:
        slot_of = {m.uuid: mig_slot(m) for m in gpu.mig_instances}
        for p in gpu.processes:
            user = _short(p.user, 60) or "unknown"
            if p.used_memory is None:
                continue
            slot = slot_of.get(p.mig_uuid or "", WHOLE)
            command = _short(p.command, 60) if s.view.show_commands else ""
            names = [*s.labels(gpu), *slot, str(p.pid), user, command]
            procs.add_metric(names, p.used_memory)
            per_user[user] = per_user.get(user, 0.0) + p.used_memory
    users = s.Gauge(
        "gpuwarden_user_memory_used_bytes",
        "GPU memory held by a user's processes, all GPUs together",
        labels=["user", "hostname"],
    )
    for user, used in sorted(per_user.items()):
        users.add_metric([user, s.host], used)
    return [procs, users]


def _reading(s: Scrape) -> list:
    """How the last read of the machine went."""
    return [
        s.Counter(
            "gpuwarden_scrape_errors",
            "GPU reads that failed (a GPU NVML could not read, or a whole read)",
            value=s.view.scrape_errors,
        ),
        s.Gauge(
            "gpuwarden_nvml_up", "1 when NVML answered the last read", value=int(s.view.nvml_up)
        ),
        s.Gauge(
            "gpuwarden_snapshot_read_seconds",
            "How long the last snapshot read took",
            value=s.view.read_seconds,
        ),
    ]


def _flag(value: Optional[bool]) -> Optional[int]:
    return None if value is None else int(value)


#: Every family a scrape exposes, in order: the table `families` walks.
PARTS: tuple[Part, ...] = (
    _info,
    per_gpu("gpuwarden_gpu_memory_used_bytes", "GPU memory in use", lambda g: g.memory_used),
    per_gpu("gpuwarden_gpu_memory_total_bytes", "GPU memory size", lambda g: g.memory_total),
    per_gpu("gpuwarden_gpu_memory_free_bytes", "GPU memory free", lambda g: g.memory_free),
    per_gpu(
        "gpuwarden_gpu_utilization_ratio",
        "Fraction of time a kernel ran (NVML utilization.gpu)",
        lambda g: _ratio(g.utilization_gpu),
    ),
    per_gpu(
        "gpuwarden_gpu_memory_utilization_ratio",
        "Fraction of time memory was read or written (NVML utilization.memory)",
        lambda g: _ratio(g.utilization_memory),
    ),
    per_gpu("gpuwarden_gpu_temperature_celsius", "GPU core temperature", lambda g: g.temperature),
    per_gpu("gpuwarden_gpu_power_watts", "Power draw", lambda g: g.power_draw),
    per_gpu("gpuwarden_gpu_power_limit_watts", "Power limit", lambda g: g.power_limit),
    per_gpu("gpuwarden_gpu_fan_speed_ratio", "Fan speed", lambda g: _ratio(g.fan_speed)),
    per_gpu(
        "gpuwarden_gpu_sm_clock_hertz",
        "SM clock",
        lambda g: None if g.clock_sm is None else g.clock_sm * 1e6,
    ),
    per_gpu(
        "gpuwarden_gpu_energy_joules",
        "Energy used since the driver loaded",
        lambda g: g.energy_consumed,
        counter=True,
    ),
    _ecc,
    per_gpu(
        "gpuwarden_gpu_pcie_replays",
        "PCIe replays since the driver loaded",
        lambda g: g.pcie_replay_count,
        counter=True,
    ),
    per_gpu(
        "gpuwarden_gpu_remapped_rows_pending",
        "1 when a memory row remap waits for a GPU reset",
        lambda g: _flag(g.remapped_rows_pending),
    ),
    per_gpu(
        "gpuwarden_gpu_remapped_rows_failure",
        "1 when row remapping failed",
        lambda g: _flag(g.remapped_rows_failure),
    ),
    per_gpu("gpuwarden_gpu_lost", "1 when the GPU has fallen off the bus", lambda g: int(g.lost)),
    _throttled,
    _xids,
    _health,
    _drained,
    _leased,
    _mig_memory,
    _idle,
    _processes,
    _reading,
    lambda s: queue_families(s.view.queue, s.host),
)


def families(view: View, dcgm_compat: bool = False) -> list:
    """The metric families for one view (prometheus_client `Metric`s): the table
    `PARTS`, then dcgm-exporter's names for the same readings with `dcgm_compat`."""
    scrape = Scrape(view)
    out: list = []
    for part in PARTS:
        out += part(scrape)
    if dcgm_compat:
        out += dcgm_families(view)
    return out


def _units(gpu: Gpu) -> list[tuple[str, tuple[str, str]]]:
    """What a lease can hold on `gpu`, by UUID: the GPU, or in MIG mode each instance."""
    if gpu.mig_mode and gpu.mig_instances:
        return [(m.uuid, mig_slot(m)) for m in gpu.mig_instances]
    return [(gpu.uuid, WHOLE)]


def _bool(value: object) -> str:
    return "true" if value else "false"


def _short(text: object, limit: int) -> str:
    """A label value: a string (whatever type a record held), one line, at most `limit`."""
    text = ("" if text is None else str(text)).replace("\n", " ")
    return text if len(text) <= limit else text[: limit - 1] + "…"


def render(view: View, dcgm_compat: bool = False) -> str:
    """The text exposition for one view (tests, `--once`)."""
    from prometheus_client import CollectorRegistry, generate_latest

    class _Once:
        def collect(self):
            yield from families(view, dcgm_compat)

    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Once())  # type: ignore[arg-type]
    body = generate_latest(registry)
    if dcgm_compat:
        from gpuwarden.exporter.dcgm import typed

        body = typed(body)
    return body.decode()
