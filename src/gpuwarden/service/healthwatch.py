"""The health watch the queue service runs in itself (gpuwarden.health.watch).

The service places jobs on GPUs, so it is the one that must stop placing them on a GPU
that had a fatal fault: a lab that runs no exporter still gets a fatal XID drained.
The watch's two threads (the XID listener and the health poll) run beside the
service's loop and touch nothing of its state: a drain is a file in the state
directory, which the next plan reads like any admin's drain. Every automatic drain,
and every other finding, is a line of the service's log, and goes to `health.webhook`,
else the service's own `service.webhook`, and to `health.hook`, as the exporter's
watch sends them.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, Optional

if TYPE_CHECKING:
    from gpuwarden.config import Config
    from gpuwarden.health.judgement import Symptom
    from gpuwarden.health.watch import HealthWatch
    from gpuwarden.machine.inventory import Gpu

log = logging.getLogger("gpuwarden.serve")


def start(reading: Config, webhook: Optional[str]) -> Optional[HealthWatch]:
    """The watch, started, for the configuration `reading`; `webhook`: the service's,
    which its findings go to where `health.webhook` names none. None (and a log line
    saying why) where the health settings are refused: the service serves on."""
    from gpuwarden.base.errors import UserError
    from gpuwarden.base.records import replace
    from gpuwarden.health.watch import HealthWatch, settings_from_config

    try:
        settings = settings_from_config(reading)
    except UserError as err:
        log.error("health watch not started: %s", err)
        return None
    if settings.webhook is None and webhook is not None:
        settings = replace(settings, webhook=webhook)
    watch = HealthWatch(settings, log=_said, on_finding=_logged)
    log.info(
        "health watch: policy %s, every %gs%s",
        settings.policy,
        settings.poll_seconds,
        f", findings posted to {settings.webhook}" if settings.webhook else "",
    )
    return watch.start()


def _said(line: str) -> None:
    log.warning("health watch: %s", line)


def _logged(gpu: Gpu, finding: Symptom, event: dict[str, Any]) -> None:
    """Each finding in the service's log; an automatic drain says so, naming the GPU."""
    if event.get("drained"):
        log.warning(
            "health watch drained GPU %s (%s): %s; `gpuwarden undrain %s` once it is fixed",
            gpu.index,
            gpu.uuid,
            finding.reason,
            gpu.index,
        )
    else:
        log.warning("health watch: GPU %s %s: %s", gpu.index, finding.level, finding.reason)
