"""An attached job's client across restarts of the service.

`gpuwarden run` through the service passes its terminal to the job and waits on a
connection for the job's end. A restart of the service (SIGTERM, `systemctl restart`,
`kill -9`) drops that connection but must not end the job: the job already holds
the terminal, and the client reconnects and attaches again (`attach`). What ends an
attached job is the client's own death, as a shell's death ends what it started.

So the service keeps, beside the job's exit record and marker, which process the
client is (`N.client`: its pid and start time, from SO_PEERCRED), and a restarted
service cancels a job whose client has died, or has not come back within
`REATTACH_WITHIN` (a client whose pid the kernel did not give, from another pid
namespace, has only that bound).
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Callable, Container
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Optional

from gpuwarden.base.errors import UserError
from gpuwarden.files.safefiles import read_small, write_atomic
from gpuwarden.service import spawn

if TYPE_CHECKING:
    from gpuwarden.service.connection import Connection

CLIENT_SUFFIX = ".client"
#: Seconds a restarted service waits for an attached job's client to come back; a
#: client gives up reconnecting sooner (`client.RECONNECT_FOR`).
REATTACH_WITHIN = 330.0


@dataclass(frozen=True)
class ClientProcess:
    """The process of an attached job's client: pid and start time (0, -1: unknown)."""

    pid: int
    since: int

    def alive(self) -> Optional[bool]:
        """Whether it still runs (None: unknown, its pid was not visible)."""
        if self.pid <= 0 or self.since < 0:
            return None
        return spawn.alive(self.pid, self.since)


def client_path(status_dir: str, job: str) -> str:
    return os.path.join(status_dir, f"{job}{CLIENT_SUFFIX}")


def record_client(status_dir: str, job: str, pid: int) -> None:
    """Note the client `pid` (0: not visible to the service) of attached `job`."""
    since = spawn.start_time(pid) if pid > 0 else -1
    with contextlib.suppress(OSError, UserError):
        # Not fsynced: a power cut ends every job anyway, and `run` waits for no fsync.
        data = json.dumps({"pid": pid, "since": since})
        write_atomic(client_path(status_dir, job), data, mode=0o600, durable=False)


def read_client(status_dir: str, job: str) -> Optional[ClientProcess]:
    """The client recorded for `job`; unknown (0, -1) when its record is unreadable,
    None when there is none: the service was stopped between recording the job and
    answering its submit, so the client never learnt which job to attach to."""
    try:
        raw, _ = read_small(client_path(status_dir, job), what="client record")
        data = json.loads(raw)
        pid, since = data["pid"], data["since"]
        if isinstance(pid, int) and isinstance(since, int):
            return ClientProcess(pid, since)
    except FileNotFoundError:
        return None
    except (OSError, UserError, ValueError, TypeError, KeyError):
        pass
    return ClientProcess(0, -1)


def forget_client(status_dir: str, job: str) -> None:
    with contextlib.suppress(OSError):
        os.unlink(client_path(status_dir, job))


def shell_status(
    state: str, code: Optional[int], signal: Optional[int], error: Optional[str]
) -> int:
    """The status a shell would report for an ended job (as `exitrecord.Ended.shell_status`):
    128+signal, the exit code, 127 for a command that never ran, 143 for a job
    cancelled before it started."""
    if signal:
        return 128 + signal
    if code is not None:
        return code
    if state == "CANCELLED":
        return 143
    return 127 if error else 1


def gone(
    orphans: dict[int, tuple[float, ClientProcess]], attached: Container[int], now: float
) -> list[tuple[int, str]]:
    """The jobs of `orphans` (job -> until when its client may come back, the client)
    whose client will not come back, each with why; they leave `orphans`. A job in
    `attached` has its client back."""
    out = []
    for job_id, (deadline, client) in list(orphans.items()):
        alive = client.alive()
        if job_id in attached:
            del orphans[job_id]
        elif alive is False or now >= deadline:
            del orphans[job_id]
            out.append((job_id, "died" if alive is False else "did not come back"))
    return out


class Attachments:
    """Which connection waits on which attached job, the terminal it passed while the
    job waits, and the jobs whose client a restart cut off. The socket loop
    (service.clients) owns them and sends through `send`; the job's life
    (service.joblife) tells a client of its job through `notify`."""

    def __init__(self, send: Callable[[Connection, dict[str, Any]], None]) -> None:
        self.send = send
        self.attached: dict[int, Connection] = {}  # job id -> the client waiting on it
        self.stdio: dict[int, list[int]] = {}  # job id -> the client's stdin/out/err
        # Attached jobs whose client a restart cut off: (until when it may come back, it).
        self.orphans: dict[int, tuple[float, ClientProcess]] = {}

    def notify(self, job_id: int, event: dict[str, Any]) -> None:
        """Tell the job's attached client, if one waits, that `event` happened."""
        client = self.attached.get(job_id)
        if client is not None:
            self.send(client, {"ok": True, "job": job_id, **event})

    def release_stdio(self, job_id: int) -> None:
        """Close the terminal an attached client passed for its job, if it is still here."""
        for fd in self.stdio.pop(job_id, ()):
            with contextlib.suppress(OSError):
                os.close(fd)

    def hold(self, job_id: int, client: Connection, stdio: Optional[list[int]]) -> None:
        """`client` waits on `job_id` now (and passed its terminal, while the job waits)."""
        if stdio is not None:
            self.release_stdio(job_id)
            self.stdio[job_id] = stdio
        client.job = job_id
        self.attached[job_id] = client
        self.orphans.pop(job_id, None)

    def left(self, job_id: int) -> None:
        """The job's client went away: nothing of it is kept."""
        self.attached.pop(job_id, None)
        self.release_stdio(job_id)

    def ended(self, job_id: int) -> None:
        """The job ended: its client waits on nothing, its terminal is closed."""
        client = self.attached.pop(job_id, None)
        if client is not None:
            client.job = None
        self.release_stdio(job_id)
        self.orphans.pop(job_id, None)
