"""One reading of the machine and its queue, as the terminal view and the assistants'
server show them.

The GPUs are the web page's (`web.model`): each with its processes and their users,
its leases (a service job's lease named as its owner's), health and drain, its MIG
slices. The jobs are the queue service's own rows (`queue` answers them; docs/service.md),
asked as whoever runs the reader, so what the service hides from that user stays
hidden. No service is an ordinary answer: the GPUs are still read, and `service`
says why there is no queue.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, Optional

from gpuwarden.base.errors import UserError
from gpuwarden.base.records import field, record


@record
class Lab:
    """One moment of one host: its GPUs and its queue."""

    host: str
    taken_at: float
    gpus: list[dict[str, Any]] = field(default_factory=list)  # web.model's GPU objects
    jobs: list[dict[str, Any]] = field(default_factory=list)  # the service's queue rows
    bookings: list[dict[str, Any]] = field(default_factory=list)
    total: int = 0  # jobs the service counts (more than `jobs` when a page was asked)
    user: Optional[str] = None  # who the service says we are (the kernel's word)
    admin: bool = False
    service: Optional[str] = None  # None: the queue answered; else why there is none
    error: Optional[str] = None  # why the GPUs could not be read
    mine: Optional[list[dict[str, Any]]] = None  # our own jobs, where asked apart (`read_lab`)


def ask_queue(
    path: str, rows: Optional[int] = None, mine: int = 0, **filters: Any
) -> dict[str, Any]:
    """The service's `hello` and `queue` (arrays folded into one row each, as `queue`
    prints them), in the shape `web.queue.Asker.ask` gives: `{"state": "absent"}`,
    `{"state": "failed", "error": ...}` or `{"state": "answered", ...}`."""
    from gpuwarden.queueclient.client import connect

    try:
        client = connect(path, timeout=10.0)
        if client is None:
            return {"state": "absent"}
        with client:
            hello = client.call("hello")
            jobs, reply = client.listing("queue", rows, arrays=True, **filters)
            own = None
            if mine and isinstance(hello.get("user"), str):
                own, _ = client.listing("queue", mine, arrays=True, user=hello["user"])
    except (UserError, OSError, ValueError) as err:
        return {"state": "failed", "error": str(err)}
    return {"state": "answered", "hello": hello, "queue": {**reply, "jobs": jobs}, "mine": own}


def read_lab(
    path: str,
    *,
    rows: Optional[int] = None,
    user: Optional[str] = None,
    mine: int = 0,
    snapshot: Optional[Callable[[], Any]] = None,
    now: Optional[float] = None,
) -> Lab:
    """This machine now: its GPUs, and the first `rows` of its queue in the queue's
    order (None: every job), only `user`'s where named (the service filters); with
    `mine`, also the first `mine` of our own jobs, whatever the rows shown."""
    from gpuwarden.monitoring.machineview import read_view
    from gpuwarden.web.model import build

    answer = ask_queue(path, rows, mine, **({} if user is None else {"user": user}))
    now = time.time() if now is None else now
    try:
        if snapshot is None:
            from gpuwarden.machine.inventory import read_snapshot

            snap = read_snapshot()
        else:
            snap = snapshot()
        view = read_view(snap)
        doc = build(
            view.snapshot,
            leases=view.leases,
            drains=view.drains,
            findings=view.findings,
            now=now,
            service=_running_only(answer),
        )
        gpus, host, error = doc["gpus"], str(doc["hostname"]), doc.get("error")
    except Exception as err:  # a failed read costs the GPUs, never the queue
        import socket

        gpus, host, error = [], socket.gethostname(), f"cannot read GPUs: {err}"
    return lab_of(answer, host, now, gpus, error)


def _running_only(answer: dict[str, Any]) -> dict[str, Any]:
    """The answer with only its running jobs: all the GPUs' part of the page needs (whose
    job a service lease is); the waiting ones would only be formatted to be thrown away,
    a thousand of them at every refresh."""
    queue = answer.get("queue")
    if answer.get("state") != "answered" or not isinstance(queue, dict):
        return answer
    running = [
        j for j in queue.get("jobs") or () if isinstance(j, dict) and j.get("state") != "PENDING"
    ]
    return {**answer, "queue": {**queue, "jobs": running}}


def lab_of(
    answer: dict[str, Any],
    host: str,
    now: float,
    gpus: list[dict[str, Any]],
    error: Optional[str] = None,
) -> Lab:
    """A `Lab` from the service's answer (`ask_queue`) and the GPUs."""
    from gpuwarden.web.queue import NO_QUEUE

    state = answer.get("state")
    if state != "answered":
        why = NO_QUEUE if state == "absent" else f"service not answering: {answer.get('error')}"
        return Lab(host=host, taken_at=now, gpus=gpus, service=why, error=error)
    hello, queue = answer.get("hello") or {}, answer.get("queue") or {}
    jobs = [j for j in queue.get("jobs") or () if isinstance(j, dict)]
    total = queue.get("total")
    return Lab(
        host=host,
        taken_at=now,
        gpus=gpus,
        jobs=jobs,
        bookings=[b for b in queue.get("bookings") or () if isinstance(b, dict)],
        total=total if isinstance(total, int) else len(jobs),
        user=hello.get("user") if isinstance(hello.get("user"), str) else None,
        admin=hello.get("admin") is True,
        error=error,
        mine=[j for j in answer["mine"] if isinstance(j, dict)]
        if isinstance(answer.get("mine"), list)
        else None,
    )


def read_hosts(hosts: list[str]) -> list[Lab]:
    """Every host's lab over the user's ssh (docs/hosts.md): its GPUs from its own `web
    --once`, its jobs from its own `queue --json --all`, asked of all hosts at once. A
    host that does not answer is a lab with no GPUs and the reason."""
    from gpuwarden.hosts.remote import ask_json

    now = time.time()
    pages = ask_json(hosts, ["web", "--once"])
    queues = {host: (doc, why) for host, doc, why in ask_json(hosts, ["queue", "--json", "--all"])}
    labs = []
    for host, doc, why in pages:
        if not isinstance(doc, dict):
            labs.append(Lab(host=host, taken_at=now, service=why, error=why))
            continue
        rows, refused = queues.get(host, (None, "no answer"))
        found = doc.get("queue")
        section: dict[str, Any] = found if isinstance(found, dict) else {}
        gpus = [g for g in doc.get("gpus") or () if isinstance(g, dict)]
        if not isinstance(rows, list):
            labs.append(Lab(host=host, taken_at=now, gpus=gpus, service=refused or "no queue"))
            continue
        jobs = [r for r in rows if isinstance(r, dict)]
        labs.append(
            Lab(
                host=host,
                taken_at=now,
                gpus=gpus,
                jobs=jobs,
                bookings=[b for b in section.get("bookings") or () if isinstance(b, dict)],
                total=len(jobs),
                user=section.get("user") if isinstance(section.get("user"), str) else None,
                admin=section.get("admin") is True,
            )
        )
    return labs
