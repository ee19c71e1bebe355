"""The queue service's state, declared and made in one place.

`server.Service` is one object, one chain of three classes that each inherit only
what they call and never reach upward: `Core` (this state) <- `Lifecycle` (a job's
life) <- `Requests` (the answers) <- `Service` (the socket loop). Every attribute is
declared and given its first value here, once; a concern adds methods, never state
of its own. The rest are collaborators with explicit inputs: the journal
(service.store, whose job states move only by service.states' table), what the last
pass of the plan worked out (`queue`, service.queuestate: written by the pass alone),
the limits in force (service.limiting: functions of the settings and the journal),
and functions that name what they need of the service as a protocol mypy checks
(service.timelimits, service.attaching, service.reloading, service.preempting,
service.unwritten, service.placing).

The one thing a lower concern needs from the top is to tell an attached client
about its job (`notify_attached`): the socket loop owns the connections, so it
is declared here and written there.
"""

from __future__ import annotations

import os
import selectors
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Optional

from gpuwarden.service.queuestate import QueueState

if TYPE_CHECKING:
    from gpuwarden import config
    from gpuwarden.service import store
    from gpuwarden.service.attachment import Attachments
    from gpuwarden.service.machine import Machine
    from gpuwarden.service.notify import JobNotifier
    from gpuwarden.service.pacing import Pacer
    from gpuwarden.service.sampler import Sampler
    from gpuwarden.service.settings import Settings
    from gpuwarden.service.watching import ServiceWatch


class Core:
    """What the service knows between two turns of its loop."""

    store: store.Store  # the journal, opened by `server.Service`
    attachments: Attachments  # the attached jobs' clients, the socket loop's (service.clients)

    def __init__(
        self, settings: Settings, hardware: Machine, notifier: JobNotifier, pacer: Pacer
    ) -> None:
        self.settings = settings
        self.hardware = hardware  # the GPUs as planned on, read as decisions need them
        self.read_snapshot: Callable[[], Any] = hardware.read  # the whole machine, now
        self.notifier = notifier
        self.pacer = pacer  # when to plan next: at once, or coalesced (service.pacing)
        self.exits = os.path.join(settings.state_dir, "jobs")  # exit records and markers
        self.locks: list[int] = []  # the journal's and the socket's, held for the service's life
        self.selector: selectors.BaseSelector = selectors.DefaultSelector()
        self.watched: dict[int, int] = {}  # job id -> pidfd of its supervisor (or job)
        self.processes: dict[int, int] = {}  # job id -> pidfd of the job's first process
        self.litter: list[str] = []  # files of ended jobs, removed after the next start
        # job id -> its end (or cancel) the journal could not take yet (service.unwritten)
        self.unwritten: dict[int, Callable[[], None]] = {}
        self.archived_at = 0.0  # when history is next looked at for archiving (archive)
        self.termed: dict[int, float] = {}  # job id -> when SIGTERM was sent for its time
        self.preempting: dict[int, float] = {}  # job id -> when its preemption signal went
        self.preempted: dict[str, int] = {}  # preemptions since the start, by the victim's owner
        self.stopping = False
        self.reload_asked = False  # SIGHUP came: reload at the next turn of the loop
        self.next_tick = 0.0  # monotonic time of the next time-limit and idle-client round
        self.swept = 0.0  # when the cgroups of ended jobs were last looked for
        self.digested = 0.0  # when due digests were last looked for (service.digests)
        # What the last pass of the plan worked out, read between passes (one writer).
        self.queue = QueueState()
        self.listed: Optional[tuple[Any, list[store.Job]]] = None  # `queue`'s rows (listing)
        self.machine: Any = None  # the Snapshot read at start (service.admission)
        # The configuration as last read: at start, then by each pass that plans. What
        # changes without a reload (where drains and XID logs are, the health rules) is
        # taken from it and handed down; a submit is judged by it (service.admission).
        self.reading: Optional[config.Config] = None
        self.cgroup_mode: Optional[str] = None  # the machine's cgroup hierarchy, found once
        self.watch: Optional[ServiceWatch] = None  # the enforcement watch, made on first need
        self.sampler: Optional[Sampler] = None  # the running jobs' GPUs for `eff`, likewise
        # (user, account) -> GPU-seconds of ended runs, read once, then added to (`ran`)
        self.usage_totals: Optional[dict[tuple[str, str], float]] = None
        # What `gpuwarden serve` was started with: its options over the files (config
        # keys), its socket and state directory, and the admins it named (service.reloading).
        self.options: Mapping[str, Any] = {}
        self.fixed: Mapping[str, Any] = {}
        self.extra_admins: tuple[str, ...] = ()
