"""The page's queue and fair-share sections, from the queue service (`gpuwarden serve`).

`QueuePoller` is the only part that talks: once per interval, in a thread of
its own, it asks the service's socket `queue` and `share` (and `hello` once per
connection, the month's `report` once a minute: web.usage) within one deadline,
and keeps the raw answers; the page's feed hands the latest to `section()`, a
pure function that turns them into the document's `queue` object and per-user
fair-share figures. Every open page then gets those same bytes: the service is
asked once per interval, never once per client, and a slow service delays the
queue section only, never the GPUs.

The service is trusted to be the service, not to be well-formed: a missing or
mistyped field costs that row or that figure, an answer that is not the
expected shape, or one that does not come within the deadline, shows the
section as "service not answering" while the GPUs stay live.

The page connects as whoever runs `gpuwarden web`, and the service hides other
users' commands from non-admins. The page shows commands only when the admin
asked for them (`web.show_commands`), and then only what the service gave.
"""

from __future__ import annotations

import shlex
import socket
import threading
import time
from collections.abc import Mapping
from typing import Any, Optional

from gpuwarden.base.errors import UserError
from gpuwarden.web import usage
from gpuwarden.web.values import finite, text, user_row

NO_QUEUE = "no queue service on this machine"

RUNNING_STATES = ("STARTING", "RUNNING")
WAITING_STATES = ("PENDING",)
JOBS_SHOWN = 200  # rows of each list in the document; the rest are counted in `hidden`
NOT_ANSWERING = "service not answering"
DEFAULT_TIMEOUT = 2.0  # seconds for one round of questions (a loaded machine is slow)


class Asker:
    """One connection to the service, kept between questions (`hello` is asked once
    per connection); any failure closes it, and the next question reconnects."""

    def __init__(self, path: str, timeout: float = DEFAULT_TIMEOUT) -> None:
        self.path = path
        self.timeout = timeout
        self.sock: Optional[socket.socket] = None
        self.decoder: Any = None
        self.hello: Any = None
        self.usage: Optional[dict[str, Any]] = None  # the month's reports (web.usage)
        self.usage_at = float("-inf")  # monotonic time they were asked

    def close(self) -> None:
        if self.sock is not None:
            self.sock.close()
        self.sock = None

    def ask(self) -> dict[str, Any]:
        """The service's answers to hello, queue and share, or why there are none.

        `{"state": "absent"}` when no service listens at the path (the ordinary case
        on a workstation), `{"state": "failed", "error": ...}` when it did not answer
        in time or not in its protocol, else `{"state": "answered", "hello": ...,
        "queue": ..., "share": ...}` with the replies as they came."""
        deadline = time.monotonic() + self.timeout
        try:
            if self.sock is None and not self._connect():
                return {"state": "absent"}
            out: dict[str, Any] = {"state": "answered", "hello": self.hello}
            for op in ("queue", "share"):
                out[op] = self._call(op, deadline)
            if time.monotonic() - self.usage_at >= usage.EVERY:
                self.usage_at = time.monotonic()
                self.usage = self._month(deadline)
            if self.usage is not None:
                out["usage"] = self.usage
            return out
        except TimeoutError:
            self.close()
            return {"state": "failed", "error": f"no answer within {self.timeout:g} s"}
        except (OSError, ValueError, UserError) as err:  # UserError: a ProtocolError
            self.close()
            return {"state": "failed", "error": _why(err)}

    def _connect(self) -> bool:
        import errno

        from gpuwarden.queueclient import protocol

        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        try:
            sock.connect(self.path)
        except OSError as err:
            sock.close()
            if err.errno in (errno.ENOENT, errno.ECONNREFUSED, errno.ENOTDIR):
                return False
            raise ConnectionError(f"cannot connect: {_why(err)}") from None
        self.sock, self.decoder = sock, protocol.Decoder()
        self.hello = self._call("hello", time.monotonic() + self.timeout)
        return True

    def _month(self, deadline: float) -> dict[str, Any]:
        """This month's GPU-hours by user and by account (`report`, asked EVERY s)."""
        since, month = usage.window(time.time())
        out: dict[str, Any] = {"month": month}
        for by in ("user", "account"):
            out[by] = self._call("report", deadline, since=since, until=time.time(), by=by)
        return out

    def _call(self, op: str, deadline: float, **fields: Any) -> Any:
        from gpuwarden.queueclient import protocol

        assert self.sock is not None
        request = protocol.encode({"v": protocol.VERSION, "op": op, **fields})
        return _call(self.sock, self.decoder, request, deadline)


def ask(path: str, timeout: float = DEFAULT_TIMEOUT) -> dict[str, Any]:
    """`Asker.ask` once, on a connection of its own."""
    asker = Asker(path, timeout)
    try:
        return asker.ask()
    finally:
        asker.close()


class QueuePoller:
    """Asks the service once per interval in a thread of its own, so the page's GPUs
    never wait for it: the feed takes the latest answer, however slow the service."""

    def __init__(self, path: str, interval: float, timeout: float = DEFAULT_TIMEOUT) -> None:
        self.asker = Asker(path, timeout)
        self.interval = interval
        self.answer: Optional[dict[str, Any]] = None
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None

    def latest(self) -> dict[str, Any]:
        """The last answer; without the thread running (`web --once`), asked now."""
        if self._thread is None or self.answer is None:
            self.answer = self.asker.ask()
        return self.answer

    def start(self) -> QueuePoller:
        self.answer = self.asker.ask()  # the first page must not find the queue empty
        self._thread = threading.Thread(target=self._loop, name="gpuwarden-web-queue", daemon=True)
        self._thread.start()
        return self

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            self.answer = self.asker.ask()
        self.asker.close()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(self.asker.timeout + 5)


def _call(sock: socket.socket, decoder: Any, request: bytes, deadline: float) -> Any:
    """One answer by `deadline`: the deadline bounds the whole exchange, so a service
    that trickles a byte at a time cannot hold the page's feed."""
    sock.settimeout(max(0.001, deadline - time.monotonic()))
    sock.sendall(request)
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError
        sock.settimeout(left)
        try:
            data = sock.recv(65536)
        except TimeoutError:
            raise TimeoutError from None
        if not data:
            raise ConnectionError("the service closed the connection")
        messages = decoder.feed(data)
        if messages:
            return messages[0]


def _why(err: BaseException) -> str:
    return text(getattr(err, "strerror", None) or str(err) or type(err).__name__)


# --- the document's sections (pure) ------------------------------------------------


def section(
    answer: Optional[Mapping[str, Any]],
    now: float,
    show_commands: bool = False,
    index: Optional[Mapping[str, int]] = None,
) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
    """The document's `queue` object and the fair-share figures by user name.

    `answer` is what `ask()` returned, or None when nobody asked (no service
    configured, or tests of other sections); `index` maps the GPUs' UUIDs (how
    the service names a job's GPUs) to their indexes on the page."""
    index = index or {}
    empty: dict[str, Any] = {
        "service": False,
        "state": NO_QUEUE,
        "user": None,
        "admin": False,
        "error": None,
        "running": [],
        "waiting": [],
        "hidden": 0,
    }
    if not isinstance(answer, Mapping) or answer.get("state") == "absent":
        return empty, {}
    if answer.get("state") != "answered":
        return {
            **empty,
            "state": NOT_ANSWERING,
            "error": text(answer.get("error") or "malformed answer"),
        }, {}
    hello, queue, share = answer.get("hello"), answer.get("queue"), answer.get("share")
    problem = _refused(hello, "hello") or _refused(queue, "queue")
    rows = queue.get("jobs") if isinstance(queue, Mapping) else None
    if problem is None and not isinstance(rows, list):
        problem = "malformed answer to queue"
    if problem is not None:
        return {**empty, "state": NOT_ANSWERING, "error": problem}, {}
    assert isinstance(hello, Mapping) and isinstance(rows, list)
    jobs = [j for j in (_job(r, now, show_commands, index) for r in rows) if j is not None]
    running = sorted(
        (j for j in jobs if j["state"] in RUNNING_STATES),
        key=lambda j: (j["started"] or 0, j["id"]),
    )
    waiting = sorted(
        (j for j in jobs if j["state"] in WAITING_STATES),
        key=lambda j: (j["priority"] is None, -(j["priority"] or 0), j["id"]),
    )
    user = hello.get("user")
    doc = {
        "service": True,
        "state": "running",
        "user": text(user) if isinstance(user, str) else None,
        "admin": hello.get("admin") is True,
        "error": None,
        "running": running[:JOBS_SHOWN],
        "waiting": waiting[:JOBS_SHOWN],
        "hidden": max(0, len(running) - JOBS_SHOWN) + max(0, len(waiting) - JOBS_SHOWN),
    }
    booked = _bookings(queue.get("bookings") if isinstance(queue, Mapping) else None, now)
    if booked:
        doc["bookings"] = booked
    month = usage.panel(answer.get("usage"))
    if month is not None:
        doc["usage"] = month
    if _refused(share, "share") is not None:
        doc["error"] = _refused(share, "share")
        return doc, {}
    return doc, _shares(share.get("users") if isinstance(share, Mapping) else None)


def _bookings(rows: Any, now: float) -> list[dict[str, Any]]:
    """GPUs booked ahead (service.bookings) not yet over, by start; malformed rows left out."""
    out = []
    for row in rows if isinstance(rows, list) else ():
        if not isinstance(row, Mapping):
            continue
        booking_id, count = _int(row.get("id")), _int(row.get("count"))
        start, end = finite(row.get("start")), finite(row.get("end"))
        whom = row.get("user") or (f"@{row['group']}" if row.get("group") else None)
        if booking_id is None or count is None or start is None or end is None:
            continue
        if not isinstance(whom, str) or end <= now:
            continue
        reason = row.get("reason")
        out.append(
            {
                "id": booking_id,
                "count": count,
                "whom": text(whom),
                "start": start,
                "end": end,
                "reason": text(reason) if isinstance(reason, str) else "",
            }
        )
    out.sort(key=lambda b: (b["start"], b["id"]))
    return out[:JOBS_SHOWN]


def _refused(reply: Any, op: str) -> Optional[str]:
    if not isinstance(reply, Mapping):
        return f"malformed answer to {op}"
    if reply.get("ok") is not True:
        return text(f"{op} refused: {reply.get('error') or 'no reason given'}")
    return None


def _int(value: Any) -> Optional[int]:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _job(
    row: Any, now: float, show_commands: bool, index: Mapping[str, int]
) -> Optional[dict[str, Any]]:
    """One row of the queue, or None for a row without an id, user or state."""
    if not isinstance(row, Mapping):
        return None
    job_id, user, state = _int(row.get("id")), row.get("user"), row.get("state")
    if job_id is None or not isinstance(user, str) or not isinstance(state, str):
        return None
    submitted, started = finite(row.get("submitted")), finite(row.get("started"))
    gpus = row.get("gpus")
    uuids = [g for g in gpus if isinstance(g, str)][:64] if isinstance(gpus, list) else []
    command = row.get("command")
    shown = None
    if show_commands and isinstance(command, list) and all(isinstance(w, str) for w in command):
        shown = text(shlex.join(command))
    running = state in RUNNING_STATES
    if running:
        waited = None if submitted is None or started is None else max(0.0, started - submitted)
    else:
        waited = None if submitted is None else max(0.0, now - submitted)
    held = row.get("held")
    array_job, array_task = _int(row.get("array_job")), _int(row.get("array_task"))
    name = str(job_id) if array_job is None or array_task is None else f"{array_job}_{array_task}"
    return {
        "id": job_id,
        "name": name,  # as the CLI writes it: 117_0 for an array's task
        "user": text(user),
        "account": text(row["account"]) if isinstance(row.get("account"), str) else None,
        "state": text(state, 20),
        "gpus": [index[g] for g in uuids if g in index],
        "uuids": [text(g) for g in uuids],
        "count": _int(row.get("count")),
        "mem": _int(row.get("mem")),
        "reason": text(row.get("reason")) if isinstance(row.get("reason"), str) else None,
        "priority": finite(row.get("priority")),
        "held": held is True,
        "submitted": submitted,
        "started": started,
        "waited": waited,
        "elapsed": None if not running or started is None else max(0.0, now - started),
        "time_limit": finite(row.get("time_limit")),
        "estimated_start": finite(row.get("estimated_start")),
        "command": shown,
        "preemptible": row.get("preemptible") is True,
        "restarts": _int(row.get("restarts")) or 0,
        "preemptions": _int(row.get("preemptions")) or 0,
    }


def _figure(value: Any) -> Optional[float]:
    """A fair-share figure: finite and not negative, else unknown (None)."""
    number = finite(value)
    return number if number is not None and number >= 0 else None


def _shares(rows: Any) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for row in rows if isinstance(rows, list) else ():
        if not isinstance(row, Mapping) or not isinstance(row.get("user"), str):
            continue
        out[text(row["user"])] = {k: _figure(row.get(k)) for k in ("usage", "share", "factor")}
    return out


def merge_users(
    users: list[dict[str, Any]],
    shares: Mapping[str, Mapping[str, Any]],
    queue: Mapping[str, Any],
) -> list[dict[str, Any]]:
    """The per-user rows with fair share and job counts beside GPUs in use now; users
    the service knows (usage, jobs) but who have nothing on the GPUs get a row too."""
    by_name = {u["user"]: u for u in users}
    counts: dict[str, dict[str, int]] = {}
    for key in ("running", "waiting"):
        for job in queue.get(key, ()):
            counts.setdefault(job["user"], {"running": 0, "waiting": 0})[key] += 1
    for name in [*shares, *counts]:
        if name not in by_name:
            by_name[name] = user_row(name)
    out = []
    for name, row in by_name.items():
        figures = shares.get(name, {})
        jobs = counts.get(name, {})
        out.append(
            {
                **row,
                "usage": figures.get("usage"),
                "share": figures.get("share"),
                "factor": figures.get("factor"),
                "jobs_running": jobs.get("running", 0),
                "jobs_waiting": jobs.get("waiting", 0),
            }
        )
    return sorted(out, key=_user_order)


def _user_order(u: Mapping[str, Any]) -> tuple:
    return (-len(u["used_gpus"]), -u["memory"], -u["jobs_running"], -u["jobs_waiting"], u["user"])
