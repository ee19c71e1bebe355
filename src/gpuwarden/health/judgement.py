"""Health judgement of a GPU: pure functions over `Gpu` snapshots (plus XID events).

The rules are data (`XID_CATALOGUE`, `DEFAULT_FATAL_XIDS`, `Rules`) so an admin
can change what counts as fatal in config without touching code, and so the
same judgement serves `gpuwarden health`, `status`, the exporter and the
automatic drains. The catalogue (`gpuwarden.health.xids`, loaded when an XID is
described) follows NVIDIA's Xid catalogue ("Resolution Bucket" immediate and
investigatory actions) for Ampere and newer GPUs.

XIDs only exist as events: the health watch keeps the ones it heard in the XID
log, `gpuwarden.health.xidlog`, which also says whose logs are believed. This module
reads no state file itself; `judge_all` without XIDs asks the log.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping

from gpuwarden.base.records import field, record, replace
from gpuwarden.machine.inventory import Gpu

TYPE_CHECKING = False  # typing stays off the start-up path; annotations need it only here
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any, Optional

OK, WARNING, FATAL = "ok", "warning", "fatal"


@record
class Symptom:
    """One thing wrong (or worth a look) with a GPU — a symptom, named apart from the
    doctor's `Finding` (a check's verdict); `code` says whether it is new."""

    level: str  # OK, WARNING or FATAL
    reason: str  # what was seen, one line
    action: str = ""  # NVIDIA's recommended action
    code: str = ""  # stable key for "is this new?", e.g. "xid-79", "lost", "throttle-hw_thermal"


# NVIDIA's resolution buckets, in words an admin can act on.
ACTIONS: dict[str, str] = {
    "IGNORE": "no action needed",
    "RESTART_APP": "restart the application",
    "RESET_GPU": "stop the GPU's processes, then reset it (nvidia-smi -r -i GPU)",
    "RESTART_BM": "reboot the machine (cold power cycle if the GPU stays missing)",
    "RESTART_VM": "restart the virtual machine",
    "CONTACT_SUPPORT": "contact NVIDIA support / RMA if it repeats",
    "CHECK_APP/CUDA": "check the application and CUDA code",
    "CHECK_MECHANICALS": "check cooling, power cabling and seating",
    "INVESTIGATE_SW": "check driver and firmware versions",
    "UPDATE_SWFW": "update the driver / firmware",
    # Investigatory actions, said after the immediate one ("restart the application").
    "WORKFLOW_XID_13": "if it repeats on one GPU only, run diagnostics on that GPU",
    "WORKFLOW_XID_31": "if it repeats on one GPU only, suspect the GPU and run diagnostics",
    "WORKFLOW_XID_45": "follow the XID that came with it; alone, restart the fabric manager",
    "WORKFLOW_XID_48": "reset the GPU; if row remapping then fails, RMA the GPU",
    "WORKFLOW_NVLINK_ERR": "reset the GPU; if it repeats on the same link, check NVLink cabling",
    "WORKFLOW_NVLINK5_ERR": "reset the GPU; if it repeats, check the NVLink fabric",
    "XID_154": "follow the recovery action the driver reports",
    "IGNORE (sympathetic)": "no action needed (reported alongside another error)",
}


# Fatal by default: the XIDs widely treated as "take the GPU out" (DCGM, the
# Kubernetes device plugin) plus every catalogue entry whose immediate action is
# a GPU reset or a reboot. 63, 92 and 94 are on the list although NVIDIA's
# immediate action for them is milder: on a shared box a GPU whose memory is
# degrading should stop receiving new jobs until an admin looks. Configurable
# as `health.fatal_xids`.
DEFAULT_FATAL_XIDS: frozenset[int] = frozenset(
    {48, 61, 62, 63, 64, 74, 79, 92, 94, 95, 119, 120}
    | {46, 109, 110, 136, 140, 143, 155, 156, 158}
)

# Throttle reasons (as the inventory names them) that mean something is wrong.
# A software power cap, idle clocks or application clocks are normal operation.
BAD_THROTTLE: dict[str, tuple[str, str]] = {
    "hw_thermal": ("hardware thermal slowdown", "check cooling and airflow"),
    "sw_thermal": ("software thermal slowdown", "check cooling and airflow"),
    "hw_slowdown": (
        "hardware slowdown (temperature or power brake)",
        "check cooling and the power supply",
    ),
    "hw_power_brake": (
        "external power brake slowdown",
        "check the power supply and cabling",
    ),
}


@record
class Rules:
    """The tunable part of the judgement (config keys `health.*`)."""

    fatal_xids: frozenset[int] = DEFAULT_FATAL_XIDS
    # corrected ECC errors since driver load that earn a warning
    ecc_corrected_warn: int = 1000
    # corrected ECC errors per hour (when the caller can measure a rate)
    ecc_corrected_rate_warn: float = 100.0
    pcie_replay_warn: int = 100
    throttle_warn: frozenset[str] = field(default_factory=lambda: frozenset(BAD_THROTTLE))


def parse_xids(value: object) -> frozenset[int]:
    """`health.fatal_xids` as written in config: a list of ints, or a string
    "48, 79, +13, -94" where +/- edit the default list."""
    from gpuwarden.base.errors import UserError

    if value is None or value == "":
        return DEFAULT_FATAL_XIDS
    if isinstance(value, (list, tuple, set, frozenset)):
        items = [str(v) for v in value]
    else:
        items = str(value).replace(",", " ").split()
    result: Optional[set[int]] = None
    edits: list[tuple[str, int]] = []
    for item in items:
        sign = item[0] if item[:1] in "+-" else ""
        try:
            number = int(item[1:] if sign else item)
        except ValueError:
            raise UserError(
                f"health.fatal_xids: {item!r} is not an XID number "
                '(expected e.g. [48, 79] or "+13 -94")'
            ) from None
        if sign:
            edits.append((sign, number))
        else:
            result = (result or set()) | {number}
    base = set(DEFAULT_FATAL_XIDS) if result is None else result
    for sign, number in edits:
        (base.add if sign == "+" else base.discard)(number)
    return frozenset(base)


def describe_xid(xid: int) -> tuple[str, str]:
    """(what it is, what to do) for one XID, from the catalogue."""
    from gpuwarden.health.xids import XID_CATALOGUE

    info = XID_CATALOGUE.get(xid)
    if info is None:
        return f"XID {xid}", "look it up in NVIDIA's Xid catalogue"
    action = ACTIONS.get(info.immediate, info.immediate)
    later = ACTIONS.get(info.investigatory, info.investigatory)
    if info.investigatory not in ("IGNORE", "IGNORE (sympathetic)", info.immediate):
        action = f"{action}; {later}" if later.startswith("if ") else f"{action}; then {later}"
    return f"XID {xid} ({info.description})", action


def judge(
    gpu: Gpu,
    xids: tuple[int, ...] = (),
    *,
    rules: Optional[Rules] = None,
    ecc_corrected_rate: Optional[float] = None,
) -> tuple[Symptom, ...]:
    """Every finding for one GPU, worst first; empty means healthy.

    `xids` are the XIDs seen on it (repeats allowed) since they were last
    cleared; `ecc_corrected_rate` (errors per hour) is given by callers that
    sample the counter over time."""
    rules = rules or Rules()
    found: list[Symptom] = []
    if gpu.lost:
        found.append(
            Symptom(
                FATAL,
                "GPU is lost (fallen off the bus)",
                ACTIONS["RESTART_BM"] + "; " + ACTIONS["CONTACT_SUPPORT"],
                "lost",
            )
        )
    for xid, count in sorted(Counter(xids).items()):
        what, action = describe_xid(xid)
        times = f" x{count}" if count > 1 else ""
        lvl = FATAL if xid in rules.fatal_xids else WARNING
        found.append(Symptom(lvl, f"{what}{times}", action, f"xid-{xid}"))
    if gpu.ecc_uncorrected_volatile:
        found.append(
            Symptom(
                FATAL,
                f"{gpu.ecc_uncorrected_volatile} uncorrected ECC errors since driver load",
                ACTIONS["RESET_GPU"] + "; RMA the GPU if they come back",
                "ecc-uncorrected",
            )
        )
    if gpu.remapped_rows_failure:
        found.append(
            Symptom(
                FATAL,
                "row remapping failed (no spare memory rows left)",
                "RMA the GPU",
                "remap-failure",
            )
        )
    if gpu.remapped_rows_pending:
        # NVIDIA: with a remap pending, running and new work is unaffected; the
        # remap takes effect at the next reset. Worth doing, not worth a drain.
        found.append(
            Symptom(
                WARNING,
                "memory row remapping pending",
                "reset the GPU when it is idle to apply the remap",
                "remap-pending",
            )
        )
    if gpu.retired_pages_pending:
        found.append(
            Symptom(
                FATAL,
                "ECC page retirement pending",
                "let running jobs finish, then reset the GPU to retire the pages",
                "retire-pending",
            )
        )
    corrected = gpu.ecc_corrected_volatile
    if ecc_corrected_rate is not None and ecc_corrected_rate >= rules.ecc_corrected_rate_warn:
        found.append(
            Symptom(
                WARNING,
                f"high corrected ECC error rate ({ecc_corrected_rate:.0f}/hour)",
                "watch for uncorrected errors; plan a GPU reset or RMA",
                "ecc-corrected",
            )
        )
    elif corrected is not None and corrected >= rules.ecc_corrected_warn:
        found.append(
            Symptom(
                WARNING,
                f"{corrected} corrected ECC errors since driver load",
                "watch for uncorrected errors; plan a GPU reset or RMA",
                "ecc-corrected",
            )
        )
    if gpu.pcie_replay_count is not None and gpu.pcie_replay_count >= rules.pcie_replay_warn:
        found.append(
            Symptom(
                WARNING,
                f"{gpu.pcie_replay_count} PCIe replays since driver load",
                "reseat the GPU or riser; check the PCIe slot and link speed",
                "pcie-replay",
            )
        )
    for reason in gpu.throttle_reasons or ():
        if reason in rules.throttle_warn:
            what, action = BAD_THROTTLE.get(reason, (f"clocks throttled ({reason})", ""))
            found.append(Symptom(WARNING, what, action, f"throttle-{reason}"))
    order = {FATAL: 0, WARNING: 1, OK: 2}
    # The catalogue's actions name "GPU"; a command the user can paste names this one.
    found = [replace(f, action=f.action.replace("-i GPU", f"-i {gpu.index}")) for f in found]
    return tuple(sorted(found, key=lambda f: order.get(f.level, 3)))


def level(findings: tuple[Symptom, ...]) -> str:
    """The worst level among findings (OK for none)."""
    levels = {f.level for f in findings}
    return FATAL if FATAL in levels else WARNING if WARNING in levels else OK


def rules_from_config(config: object = None) -> Rules:
    """`Rules` from the `health.*` config keys; built-in defaults where unset."""
    get = _config_getter(config)
    rules = Rules(fatal_xids=parse_xids(get("health.fatal_xids")))
    for key, attr, cast in (
        ("health.ecc_corrected_warn", "ecc_corrected_warn", int),
        ("health.ecc_corrected_rate_warn", "ecc_corrected_rate_warn", float),
        ("health.pcie_replay_warn", "pcie_replay_warn", int),
    ):
        value = get(key)
        if value is not None:
            from gpuwarden.base.errors import UserError

            try:
                if not isinstance(value, (int, float, str)):
                    raise TypeError(value)
                number: dict[str, Any] = {attr: cast(value)}  # one field, by name
                rules = replace(rules, **number)
            except (TypeError, ValueError):
                raise UserError(f"{key}: expected a number, got {value!r}") from None
    return rules


def rules_in_force(config: object = None, log: Optional[Callable[[str], None]] = None) -> Rules:
    """`rules_from_config` of `config` (None: the configuration in force), or the
    built-in rules when a setting is bad: judging a GPU goes on, and the commands that
    own the setting report it. A long-running server passes its `log`, which is told
    in one line, so the server keeps serving with the built-in rules."""
    from gpuwarden.base.errors import UserError

    try:
        return rules_from_config(config)
    except UserError as err:
        if log is not None:
            log(f"{err}; using the built-in health rules")
        return Rules()


def _config_getter(config: object = None) -> Callable[[str], object]:
    """`get` of the given config (the exporter passes the one it loaded), else of the
    configuration in force."""
    if config is None:
        from gpuwarden import config as config_module

        config = config_module.load()
    getter: Callable[[str], object] = config.get  # type: ignore[attr-defined]
    return getter


def judge_all(
    gpus: Iterable[Gpu],
    xids: Optional[Mapping[str, tuple[int, ...]]] = None,
    rules: Optional[Rules] = None,
) -> dict[str, tuple[Symptom, ...]]:
    """Symptoms per UUID for a whole snapshot, with the XIDs seen per UUID (none when
    not given: reading the XID log is `gpuwarden.health.xidlog.judged`'s, one layer up)."""
    if xids is None:
        xids = {}
    if rules is None:
        rules = rules_in_force()
    return {g.uuid: judge(g, xids.get(g.uuid, ()), rules=rules) for g in gpus}
