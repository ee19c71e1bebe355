"""One machine view: what `status`, the exporter and the web page show, read once.

A `MachineView` is a snapshot together with what the shared directories say of
its GPUs: the leases held (a container's processes shown as their lease owner's,
`attribution`), the drains, the XID log's events and the health findings they
lead to. `read_view` gathers it the same way for all three, so a GPU is judged,
attributed and drained alike on the terminal, in Prometheus and on the page.

Those directories are writable by others, so any reader may fail on a file no
reader expected. A failure costs its own part only: the GPUs are still shown.
A lease directory that cannot be read is `lease_error` (status prints it as a
warning); a reader that fails otherwise is named in `failed` (the exporter
counts it as a scrape error) and its part is taken from `previous` (the last
good view, where the caller keeps one) or left empty.
"""

from __future__ import annotations

from gpuwarden.base.records import field, record

TYPE_CHECKING = False  # typing stays off the start-up path; annotations need it only here
if TYPE_CHECKING:
    from collections.abc import Callable, Mapping
    from typing import Any, Optional

    from gpuwarden.config import Config
    from gpuwarden.health.judgement import Rules, Symptom
    from gpuwarden.leases import LeaseInfo
    from gpuwarden.machine.inventory import Snapshot

__all__ = ["MachineView", "read_view"]


@record
class MachineView:
    """One moment of the machine as every view of it shows it."""

    snapshot: Snapshot  # processes of a container under a lease shown as the lease owner's
    leases: tuple[LeaseInfo, ...] = ()
    drains: Mapping[str, Any] = field(default_factory=dict)  # uuid -> drain.Drain
    xid_events: tuple[dict[str, Any], ...] = ()  # the XID log's events in force, oldest first
    xids: Mapping[str, tuple[int, ...]] = field(default_factory=dict)  # uuid -> XIDs, oldest first
    findings: Mapping[str, tuple[Symptom, ...]] = field(default_factory=dict)  # uuid -> findings
    lease_error: Optional[str] = None  # why the lease directory could not be read
    failed: tuple[str, ...] = ()  # the readers that failed: "leases", "drains", "xids"


def read_view(
    snapshot: Snapshot,
    *,
    rules: Optional[Rules] = None,
    previous: Optional[MachineView] = None,
    config: Optional[Config] = None,
) -> MachineView:
    """`snapshot` with its leases, drains, XIDs and findings. `rules` judge the GPUs
    (None: the configured ones); `previous` supplies what a failing reader could not.
    `config`, a reading of the configuration, names the lease and state directories and
    the rules, so a command that read it once (`status`) is not read again here."""
    from gpuwarden.health import drain, judgement, xidlog

    failed: list[str] = []
    lease_dir = state_dir = None
    if config is not None:
        from gpuwarden.files.locations import lease_location, state_location

        lease_dir, state_dir = lease_location(config), state_location(config)
        if rules is None:
            rules = judgement.rules_in_force(config)

    def soft(name: str, part: str, read: Callable[[], Any], empty: Any) -> Any:
        try:
            return read()
        except Exception:
            failed.append(name)
            return getattr(previous, part) if previous is not None else empty

    leases, lease_error = _leases(previous, failed, lease_dir)
    if leases:
        from gpuwarden.leases.attribution import attribute

        snapshot = attribute(snapshot, leases)
    drains = soft("drains", "drains", lambda: dict(drain.list_drains(state_dir)), {})
    events = soft("xids", "xid_events", lambda: tuple(xidlog.xid_events(state=state_dir)), ())
    xids = _per_gpu(events)
    return MachineView(
        snapshot=snapshot,
        leases=leases,
        drains=drains,
        xid_events=events,
        xids=xids,
        findings=judgement.judge_all(snapshot.gpus, xids, rules),
        lease_error=lease_error,
        failed=tuple(failed),
    )


def _leases(
    previous: Optional[MachineView], failed: list[str], lease_dir: Optional[str] = None
) -> tuple[tuple[Any, ...], Optional[str]]:
    """The leases held, and why they could not be read. A directory we may not list
    leaves no leases; any other failure (a file no reader expected) is counted and
    serves the last good list."""
    from gpuwarden.leases import list_leases

    try:
        return tuple(list_leases(lease_dir)), None
    except OSError as err:
        return (), str(err)
    except Exception as err:
        failed.append("leases")
        return (previous.leases if previous is not None else ()), str(err)


def _per_gpu(events: tuple[dict[str, Any], ...]) -> dict[str, tuple[int, ...]]:
    """XIDs by GPU UUID, oldest first; an event of the wrong shape is skipped."""
    seen: dict[str, list[int]] = {}
    for event in events:
        try:
            seen.setdefault(str(event["uuid"]), []).append(int(event["xid"]))
        except (KeyError, TypeError, ValueError):
            continue
    return {uuid: tuple(x) for uuid, x in seen.items()}
