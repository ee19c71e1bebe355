"""`attach`: an attached job's client back after a restart of the service (its side
is `client.run_attached`; the records that let a restarted service know the client
are service.attachment). Of the service, what `AttachingService` names.
"""

from __future__ import annotations

import logging
import os
from typing import TYPE_CHECKING, Any, Optional

from gpuwarden.base.errors import UserError
from gpuwarden.service import store
from gpuwarden.service.attachment import record_client, shell_status
from gpuwarden.service.identity import Person, peer_credentials

if TYPE_CHECKING:
    from typing import Protocol

    from gpuwarden.service.attachment import Attachments
    from gpuwarden.service.connection import Connection
    from gpuwarden.service.pacing import Pacer

    class AttachingService(Protocol):
        """What attaching a client needs of the jobs' life (`joblife.JobLife` has it)."""

        store: store.Store
        exits: str
        pacer: Pacer
        attachments: Attachments  # the attached jobs' clients (the socket loop's)


log = logging.getLogger("gpuwarden.serve")


def attach(
    service: AttachingService, who: Person, job_id: int, client: Optional[Connection]
) -> dict[str, Any]:
    """An attached job's client, back after a restart of the service: it waits on
    this connection again, and its going away ends the job again. A job still
    waiting takes the terminal passed with this request; one that ended while the
    client was away is answered with its end."""
    fds = client.take_fds() if client is not None else []
    try:
        job = service.store.get(job_id)
        if job is None or job.uid != who.uid or not job.attached:
            raise UserError(f"job {job_id} is not an attached job of yours")
        if client is None or client.job is not None or job.id in service.attachments.attached:
            raise UserError(f"job {job_id} has a client attached already")
        if job.state == store.PENDING and len(fds) != 3:
            raise UserError("an attached job needs its client's stdin, stdout and stderr")
    except BaseException:
        for fd in fds:
            os.close(fd)
        raise
    if job.state != store.PENDING:  # the job had its terminal, or has ended: no copy kept
        for fd in fds:
            os.close(fd)
    if job.state in store.ENDED:
        status = shell_status(job.state, job.exit_code, job.exit_signal, job.error)
        return {
            "ok": True,
            "job": job.id,
            "event": "ended",
            "status": status,
            "error": job.error,
        }
    waiting = job.state == store.PENDING
    service.attachments.hold(job.id, client, fds if waiting else None)
    if waiting:
        service.pacer.wake()
    record_client(service.exits, str(job.id), peer_credentials(client.sock)[0])
    log.info("job %s: its client attached again", job.id)
    started = {} if job.state == store.PENDING else {"event": "started"}
    return {"ok": True, "job": job.id, **started}
