"""What every request's answer is given (service.requests' table calls each handler
with it): the jobs' life, how the service was started, and what the answers keep
between two requests. In a module of its own so that a handler written with its
concern (service.argvsubmit, say) names its type without importing the table."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Optional

from gpuwarden.service import admission, queuetext

if TYPE_CHECKING:
    from gpuwarden.service.joblife import JobLife
    from gpuwarden.service.reloading import Started
    from gpuwarden.service.store import Job


@dataclass
class Context:
    """A request's context: one for the service's life, made by `server.Service`."""

    life: JobLife  # the journal, the queue, the jobs' supervisors (service.joblife)
    started: Started  # what `gpuwarden serve` was started with: for a reload
    # `queue`'s rows as last ordered, and the journal's version they were read at
    listed: Optional[tuple[Any, list[Job]]] = None
    # `queue`'s table: each job's cells, the last listings' lines (service.queuetext)
    text: queuetext.QueueText = field(default_factory=queuetext.QueueText)
    # whether a submit could ever start here, for the machine and reading in force
    judged: admission.Judged = field(default_factory=admission.Judged)
