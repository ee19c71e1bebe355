"""The health watch: hear XIDs as NVML raises them, poll the rest, act on what is new.

Two loops run in daemon threads. The event loop blocks in `nvmlEventSetWait`
(XID critical errors are events, not readable state: a listener that is not
waiting when one happens never learns of it), writes each XID to the watch's
own XID log (`xidlog`) and wakes the poll loop. The poll loop reads a snapshot
every `health.poll_seconds`, judges every GPU and acts on findings it has not seen
before: a fatal one drains the GPU (policy `drain`; `alert` only notifies), and
every new finding goes to the hook command and/or webhook.

The watch judges XIDs only from what it heard itself: its own log (owned by
the user it runs as) and the events it could not write there. A line in a file
another user wrote never drains a GPU. Any failure to write the log or a drain
is reported on every attempt, never stops the listener, and a drain that could
not be written is tried again at every poll while its GPU stays judged fatal.

Notifications run on their own worker thread with a timeout and a bounded
queue, so a hung webhook can delay other notifications but never the polling,
the XID listener or an exporter's scrapes.
"""

from __future__ import annotations

import os
import shlex
import threading
import time
from collections.abc import Callable
from typing import Any, Optional
from urllib.parse import urlparse

from gpuwarden.base.errors import UserError
from gpuwarden.base.records import field, record
from gpuwarden.health.judgement import (
    FATAL,
    Rules,
    Symptom,
    _config_getter,
    judge,
    rules_from_config,
)
from gpuwarden.health.xidlog import record_xid, xids_seen
from gpuwarden.machine.inventory import Gpu, Snapshot
from gpuwarden.monitoring.alerts import Notifier, warn

POLICIES = ("drain", "alert")
DRAINED_BY = "gpuwarden-health"


@record
class WatchSettings:
    """How the health watch acts on a fault (drain or not, the rules, hook and webhook)."""

    policy: str = "drain"
    rules: Rules = field(default_factory=Rules)
    hook: Optional[tuple[str, ...]] = None
    webhook: Optional[str] = None
    webhook_timeout: float = 5.0
    hook_timeout: float = 30.0
    poll_seconds: float = 10.0
    slurm_node: Optional[str] = None  # drain this Slurm node on a fatal fault (slurm.drain_node)
    admins: tuple[str, ...] = ()  # service.admins: who besides root drains in a shared directory


def parse_hook(value: object) -> Optional[tuple[str, ...]]:
    """`health.hook`: a command line (split like a shell, never run by one) or a list."""
    if value is None or value == "" or value == []:
        return None
    if isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value):
        argv = tuple(value)
    elif isinstance(value, str):
        try:
            argv = tuple(shlex.split(value))
        except ValueError as err:
            raise UserError(f"health.hook: cannot split {value!r} into a command: {err}") from None
    else:
        raise UserError(f"health.hook: expected a command string or list, got {value!r}")
    if not argv:
        return None
    return argv


def parse_webhook(value: object) -> Optional[str]:
    if value is None or value == "":
        return None
    url = str(value)
    parsed = urlparse(url)
    if parsed.scheme not in ("http", "https") or not parsed.netloc:
        raise UserError(f"health.webhook: {url!r} is not an http:// or https:// URL")
    return url


def _number(get: Callable[[str], object], key: str, default: float) -> float:
    value = get(key)
    if value is None or value == "":
        return default
    try:
        number = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise UserError(f"{key}: expected a number of seconds, got {value!r}") from None
    if number <= 0:
        raise UserError(f"{key}: must be more than 0, got {value!r}")
    return number


def settings_from_config(config: object = None, policy: Optional[str] = None) -> WatchSettings:
    """Settings from `health.*`; a malformed value raises UserError naming the key."""
    get = _config_getter(config)
    chosen = str(policy or get("health.policy") or "drain").lower()
    if chosen not in POLICIES:
        raise UserError(f"health.policy: expected drain or alert, got {chosen!r}")
    return WatchSettings(
        policy=chosen,
        rules=rules_from_config(config),
        hook=parse_hook(get("health.hook")),
        webhook=parse_webhook(get("health.webhook")),
        webhook_timeout=_number(get, "health.webhook_timeout", 5.0),
        hook_timeout=_number(get, "health.hook_timeout", 30.0),
        poll_seconds=_number(get, "health.poll_seconds", 10.0),
        slurm_node=_slurm_node(get),
        admins=tuple(str(a) for a in get("service.admins") or ()),  # type: ignore[attr-defined]
    )


def _slurm_node(get: Callable[[str], object]) -> Optional[str]:
    """The Slurm node to drain on a fatal fault, when `slurm.drain_node` is set."""
    if not get("slurm.drain_node"):
        return None
    from gpuwarden.slurm.node import node_name

    class _Conf:
        def get(self, key: str) -> object:
            return get(key)

    return node_name(_Conf())


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _handle_key(handle: object) -> object:
    """Something hashable that is equal for two handles to the same device."""
    try:
        import ctypes

        return ctypes.cast(handle, ctypes.c_void_p).value
    except Exception:
        try:
            hash(handle)
            return handle
        except TypeError:
            return id(handle)


class HealthWatch:
    """Listen for XIDs and poll health; drain and notify on new findings."""

    def __init__(
        self,
        settings: Optional[WatchSettings] = None,
        *,
        read: Optional[Callable[[], Snapshot]] = None,
        nvml: Any = None,
        notifier: Optional[Notifier] = None,
        log: Callable[[str], None] = warn,
        on_finding: Optional[Callable[[Gpu, Symptom, dict[str, Any]], None]] = None,
    ) -> None:
        self.settings = settings or WatchSettings()
        self._read = read
        self._nvml = nvml
        self.log = log
        self.on_finding = on_finding
        self.notifier = notifier or Notifier(
            self.settings.hook,
            self.settings.webhook,
            webhook_timeout=self.settings.webhook_timeout,
            hook_timeout=self.settings.hook_timeout,
            log=log,
        )
        self._known: dict[str, set[str]] = {}
        self._ecc: dict[str, tuple[float, int]] = {}
        self._started = False
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        self.listening = False  # the XID listener is registered and waiting
        self.xids_heard = 0
        self._unrecorded: list[dict[str, Any]] = []  # heard, but the log could not take them
        self._to_drain: dict[str, tuple[int, str]] = {}  # uuid -> (index, reason), to retry

    # -- threads -------------------------------------------------------------

    def start(self, *, events: bool = True, poll: bool = True) -> HealthWatch:
        if self._nvml is None:
            # Load the module here, once, before two threads could race to load it.
            try:
                from gpuwarden.machine.inventory import load_nvml

                self._nvml = load_nvml()
            except Exception as err:  # no driver: the threads report it their way
                self.log(f"NVML not loadable ({err})")
        if events:
            self._spawn(self._event_loop, "gpuwarden-xid")
        if poll:
            self._spawn(self._poll_loop, "gpuwarden-health")
        return self

    def _spawn(self, target: Callable[[], None], name: str) -> None:
        thread = threading.Thread(target=target, name=name, daemon=True)
        thread.start()
        self._threads.append(thread)

    def stop(self, timeout: float = 3.0) -> None:
        self._stop.set()
        self._wake.set()
        for thread in self._threads:
            thread.join(timeout)
        self.notifier.close(timeout)

    def _snapshot(self) -> Snapshot:
        if self._read is not None:
            return self._read()
        from gpuwarden.machine.inventory import read_snapshot

        return read_snapshot(self._nvml)

    def _poll_loop(self) -> None:
        while not self._stop.is_set():
            try:
                self.check(self._snapshot())
            except UserError as err:
                self.log(str(err))
            except Exception as err:  # keep watching: one bad read is not the end
                self.log(f"health check failed: {type(err).__name__}: {err}")
            self._wake.wait(self.settings.poll_seconds)
            self._wake.clear()

    def _event_loop(self) -> None:
        try:
            nvml = self._nvml
            if nvml is None:
                from gpuwarden.machine.inventory import load_nvml

                nvml = load_nvml()
            nvml.nvmlInit()
        except Exception as err:
            self.log(f"XID events unavailable ({err}); polling only")
            return
        event_set = None
        try:
            event_set = nvml.nvmlEventSetCreate()
            devices: dict[object, tuple[str, int]] = {}
            for index in range(nvml.nvmlDeviceGetCount()):
                try:
                    handle = nvml.nvmlDeviceGetHandleByIndex(index)
                    uuid = _text(nvml.nvmlDeviceGetUUID(handle))
                    nvml.nvmlDeviceRegisterEvents(
                        handle, nvml.nvmlEventTypeXidCriticalError, event_set
                    )
                    devices[_handle_key(handle)] = (uuid, index)
                except nvml.NVMLError as err:
                    self.log(f"GPU {index}: XID events unavailable ({err})")
            self.listening = True
            while not self._stop.is_set():
                try:
                    data = nvml.nvmlEventSetWait(event_set, 500)
                except nvml.NVMLError as err:
                    if getattr(err, "value", None) == nvml.NVML_ERROR_TIMEOUT:
                        continue
                    self.log(f"waiting for XID events failed ({err}); retrying")
                    self._stop.wait(min(self.settings.poll_seconds, 5.0))
                    continue
                if not int(data.eventType) & nvml.nvmlEventTypeXidCriticalError:
                    continue
                where = devices.get(_handle_key(data.device))
                if where is None:
                    try:
                        uuid = _text(nvml.nvmlDeviceGetUUID(data.device))
                        where = next((w for w in devices.values() if w[0] == uuid), (uuid, -1))
                    except nvml.NVMLError:
                        self.log(f"XID {int(data.eventData)} on an unknown GPU")
                        continue
                try:
                    self.on_xid(where[0], int(data.eventData), where[1])
                except Exception as err:  # one event's trouble must not end the listening
                    self.log(f"XID {int(data.eventData)} not handled: {type(err).__name__}: {err}")
        except Exception as err:
            self.log(f"XID listener stopped: {type(err).__name__}: {err}")
        finally:
            self.listening = False
            try:
                if event_set is not None:
                    nvml.nvmlEventSetFree(event_set)
                nvml.nvmlShutdown()
            except Exception:
                pass

    # -- the judgement and the actions ---------------------------------------

    def on_xid(self, uuid: str, xid: int, index: Optional[int] = None) -> None:
        """One XID event: remember it for `health`/`status`, then judge at once."""
        self.xids_heard += 1
        at = time.time()
        try:
            record_xid(uuid, xid, index=index, at=at)
        except Exception as err:  # the listener must outlive any failure to write
            with self._lock:
                self._unrecorded.append({"uuid": uuid, "xid": int(xid), "at": at})
            self.log(
                f"XID {xid} on GPU {index} NOT RECORDED in the XID log ({err}); "
                "judging it from memory until this watch stops"
            )
        with self._lock:  # a repeat of the same XID is news too
            self._known.get(uuid, set()).discard(f"xid-{xid}")
        self._wake.set()

    def check(self, snapshot: Snapshot) -> list[tuple[Gpu, Symptom]]:
        """Judge every GPU; act on findings not seen in the previous check."""
        from gpuwarden.health.drain import list_drains

        xids = self._xids()
        drains = list_drains()
        self._retry_drains(drains)
        first = not self._started
        self._started = True
        new: list[tuple[Gpu, Symptom]] = []
        with self._lock:
            for gpu in snapshot.gpus:
                findings = judge(
                    gpu,
                    xids.get(gpu.uuid, ()),
                    rules=self.settings.rules,
                    ecc_corrected_rate=self._ecc_rate(gpu, snapshot.taken_at),
                )
                codes = {f.code for f in findings}
                known = self._known.setdefault(gpu.uuid, set())
                fresh = [f for f in findings if f.code not in known]
                known.intersection_update(codes)  # a cleared finding may fire again
                known.update(codes)
                if first and gpu.uuid in drains:
                    continue  # already out of service before we started: not news
                new.extend((gpu, f) for f in fresh)
        for gpu, finding in new:
            self._act(snapshot, gpu, finding, drains)
        return new

    def _xids(self) -> dict[str, tuple[int, ...]]:
        """The XIDs this watch heard: its own log (owned by the user it runs as, never
        a file someone else wrote) and the events it could not write there."""
        problems: list[str] = []
        seen = xids_seen(uids=(os.geteuid(),), problems=problems)
        for line in problems:
            self.log(line)
        with self._lock:
            for event in self._unrecorded:
                seen[event["uuid"]] = (*seen.get(event["uuid"], ()), event["xid"])
        return seen

    def _drain(self, gpu_uuid: str, index: int, reason: str) -> bool:
        """Drain one GPU for the watch; a failure is said loudly and tried again later."""
        from gpuwarden.health.drain import drain

        try:
            drain(
                gpu_uuid,
                reason,
                by=DRAINED_BY,
                auto=True,
                lock_timeout=2.0,
                force=True,
                admins=self.settings.admins,
            )
        except (UserError, NotImplementedError, OSError) as err:
            self._to_drain[gpu_uuid] = (index, reason)
            self.log(
                f"GPU {index} NOT DRAINED ({err or type(err).__name__}); it stays judged "
                "fatal and the drain is tried again at every poll"
            )
            return False
        if self._to_drain.pop(gpu_uuid, None) is not None:
            self.log(f"GPU {index} drained now ({reason})")
        return True

    def _retry_drains(self, drains: dict) -> None:
        for gpu_uuid, (index, reason) in list(self._to_drain.items()):
            if gpu_uuid in drains:
                self._to_drain.pop(gpu_uuid, None)
            elif self.settings.policy == "drain" and self._drain(gpu_uuid, index, reason):
                drains[gpu_uuid] = True

    def _ecc_rate(self, gpu: Gpu, now: float) -> Optional[float]:
        count = gpu.ecc_corrected_volatile
        if count is None:
            return None
        before = self._ecc.get(gpu.uuid)
        if before is None or count < before[1]:
            self._ecc[gpu.uuid] = (now, count)
            return None
        elapsed = now - before[0]
        if elapsed < 60:
            return None
        self._ecc[gpu.uuid] = (now, count)
        return (count - before[1]) / elapsed * 3600.0

    def _drain_slurm_node(self, gpu: Gpu, reason: str) -> None:
        """With `slurm.drain_node`, the node is drained too: Slurm then starts no new job
        on it (running ones finish), as the local drain does for this GPU."""
        node = self.settings.slurm_node
        if node is None:
            return
        from gpuwarden.slurm.tools import drain_node

        try:
            drain_node(node, f"gpuwarden: GPU {gpu.index}: {reason}")
        except UserError as err:
            warn(f"could not drain Slurm node {node}: {err}")
        else:
            warn(f"drained Slurm node {node}: GPU {gpu.index}: {reason}")

    def _act(self, snapshot: Snapshot, gpu: Gpu, finding: Symptom, drains: dict) -> None:
        drained = False
        if finding.level == FATAL and self.settings.policy == "drain" and gpu.uuid not in drains:
            drained = self._drain(gpu.uuid, gpu.index, finding.reason)
            if drained:
                drains[gpu.uuid] = True
                self._drain_slurm_node(gpu, finding.reason)
        event = {
            "hostname": snapshot.hostname,
            "gpu_index": gpu.index,
            "gpu_uuid": gpu.uuid,
            "gpu_name": gpu.name,
            "level": finding.level,
            "reason": finding.reason,
            "action": finding.action,
            "code": finding.code,
            "drained": drained,
            "policy": self.settings.policy,
            "at": time.time(),
        }
        if self.on_finding is not None:
            self.on_finding(gpu, finding, event)
        self.notifier.notify(event)


def watch_beside(
    config: object,
    read: Callable[[], Snapshot],
    rules: Rules,
    log: Callable[[str], None],
    still_on: str,
) -> HealthWatch:
    """The health watch a server (exporter, web page) runs beside itself, reading that
    server's own snapshots. A malformed hook or webhook setting costs the notifications
    (one line saying what is `still_on`), never the server: the watch then judges by
    `rules`, the server's own (`judgement.rules_in_force(config, log)`)."""
    try:
        settings = settings_from_config(config)
    except UserError as err:
        log(f"{err}; alerts disabled, {still_on} still on")
        policy = str(config.get("health.policy"))  # type: ignore[attr-defined]
        settings = WatchSettings(policy=policy, rules=rules)
    return HealthWatch(settings, read=read, log=log)
