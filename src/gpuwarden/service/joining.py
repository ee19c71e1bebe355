"""A process joins its allocation's cgroup: a notebook kernel confined as a batch job is.

A batch job is born in its job's cgroup (service.jobcgroup: only its GPUs can be
opened there). A notebook kernel started through the service is not the job's child:
its GPUs are an allocation (queueclient.holding) whose placeholder process runs in the
cgroup, while the kernel is a child of the Jupyter server, which holds the allocation.
So the Jupyter side (jupyter.provisioner) asks the service, once the kernel has
started, to move it in (`join`): from then on it and what it starts can open only the
allocation's GPUs, and a cancel or a time limit reaches it as it reaches a batch job's
processes.

The service moves only what the asker may confine: the job is theirs (or the asker is
an admin) and a running attached job, and the process is theirs and the asking
process itself or one below it (the kernel tells who asks: SO_PEERCRED, /proc). A
machine without device cgroups answers `confined: false`, as it runs batch jobs then.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Optional

from gpuwarden.base import checked as fields
from gpuwarden.base.errors import UserError
from gpuwarden.service import store
from gpuwarden.service.identity import Person, peer_credentials
from gpuwarden.service.owners import owned

if TYPE_CHECKING:
    from typing import Protocol

    from gpuwarden.service.connection import Connection
    from gpuwarden.service.settings import Settings

    class Joinable(Protocol):
        """What a join needs of the jobs' life (`joblife.JobLife` has it)."""

        settings: Settings
        store: store.Store

        def job_cgroup(self, job_id: int) -> dict[str, str]: ...


def _parent_and_uid(pid: int) -> tuple[int, int]:
    """(parent pid, real uid) of `pid` from /proc; UserError when it is gone."""
    try:
        with open(f"/proc/{pid}/status", encoding="utf-8", errors="replace") as fh:
            fields = dict(line.split(":", 1) for line in fh if ":" in line)
        return int(fields["PPid"].split()[0]), int(fields["Uid"].split()[0])
    except (OSError, KeyError, ValueError, IndexError):
        raise UserError(f"no process {pid}") from None


def _below(pid: int, ancestor: int) -> bool:
    """Whether `pid` is `ancestor` or one of its descendants."""
    seen = 0
    while pid > 1 and seen < 4096:
        if pid == ancestor:
            return True
        pid, _ = _parent_and_uid(pid)
        seen += 1
    return pid == ancestor


def join(
    service: Joinable, who: Person, message: Mapping[str, Any], client: Optional[Connection]
) -> dict[str, Any]:
    """`join`: move process `pid` into the cgroup of job `job`, an allocation of the
    asker's (service.owners), if the machine has one."""
    job_id = fields.checked_int(message.get("job"), "job", 1, 2**62)
    pid = fields.checked_int(message.get("pid"), "pid", 2, 2**22)
    job = owned(service.store, service.settings, who, job_id, "move a process into")
    if not job.attached or job.state != store.RUNNING:
        raise UserError(f"job {job_id} is not a running allocation: only those take a process")
    if client is None:
        raise UserError("join needs a connection")
    asker, _, _ = peer_credentials(client.sock)
    _, owner = _parent_and_uid(pid)
    if owner != job.uid or not _below(pid, asker):
        raise UserError(
            f"process {pid} is not yours and below the asking process: it cannot join job {job_id}"
        )
    dirs = service.job_cgroup(job_id)
    if not dirs:
        return {"ok": True, "confined": False}
    for path in dirs.values():
        try:
            with open(os.path.join(path, "cgroup.procs"), "w") as fh:
                fh.write(str(pid))
        except OSError as err:
            raise UserError(
                f"cannot move process {pid} into job {job_id}: {err.strerror}"
            ) from None
    return {"ok": True, "confined": True, "cgroups": sorted(dirs.values())}
