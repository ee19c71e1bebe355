"""`gpuwarden serve`: the socket loop that owns the queue on a shared machine.

One thread, one `selectors` loop: client sockets, one pidfd per running job's
supervisor (readable when it ends, also for supervisors adopted after a restart),
and a tick for time limits and GPUs freed by processes outside the queue. After
every event `schedule()` asks `scheduling.plan` what starts, takes the leases for
it in the service's own lease directory, records the job as STARTING, forks its
supervisor (service.spawn), and records it RUNNING. docs/service.md has the design.
"""

from __future__ import annotations

import contextlib
import logging
import os
import selectors
import signal
import socket
import stat
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

from gpuwarden import scheduling
from gpuwarden.errors import UserError
from gpuwarden.service import protocol, spawn, store
from gpuwarden.service.identity import Admins, Person, peer

log = logging.getLogger("gpuwarden.serve")


@dataclass(frozen=True)
class Settings:
    """What `gpuwarden serve` is told by its configuration ([service] table)."""

    socket: str
    state_dir: str
    lease_dir: Optional[str] = None
    policy: scheduling.Policy = field(default_factory=scheduling.Policy)
    admins: Admins = field(default_factory=Admins)
    max_jobs_per_user: Optional[int] = None
    max_time: Optional[float] = None
    show_commands: bool = False
    grace: float = 30.0  # SIGTERM to SIGKILL past a time limit
    tick: float = 1.0
    max_clients: int = 512
    idle_timeout: float = 30.0  # a client that sends nothing for this long is dropped


@dataclass
class _Client:
    sock: socket.socket
    who: Person
    decoder: protocol.Decoder = field(default_factory=protocol.Decoder)
    seen: float = field(default_factory=time.monotonic)
    fds: list[int] = field(default_factory=list)  # descriptors passed with the last message
    job: Optional[int] = None  # the attached job this connection waits for

    def take_fds(self) -> list[int]:
        fds, self.fds = self.fds, []
        return fds

    def close_fds(self) -> None:
        for fd in self.take_fds():
            with contextlib.suppress(OSError):
                os.close(fd)


class Service:
    def __init__(self, settings: Settings, snapshot: Callable[[], Any]) -> None:
        self.settings = settings
        self.read_snapshot = snapshot
        os.makedirs(settings.state_dir, mode=0o700, exist_ok=True)
        self.exits = os.path.join(settings.state_dir, "jobs")
        os.makedirs(self.exits, mode=0o700, exist_ok=True)
        self.store = store.Store(os.path.join(settings.state_dir, "jobs.db"))
        self.selector = selectors.DefaultSelector()
        self.clients: dict[int, _Client] = {}
        self.watched: dict[int, int] = {}  # job id -> pidfd of its supervisor (or job)
        self.termed: dict[int, float] = {}  # job id -> when SIGTERM was sent for its time
        self.listener: Optional[socket.socket] = None
        self.stopping = False
        self.dirty = True  # something changed: plan again
        self._priorities: dict[int, float] = {}
        self._estimates: dict[int, Optional[float]] = {}
        self.memory: dict[str, int] = {}  # GPU memory by UUID, from the last snapshot
        self.attached: dict[int, _Client] = {}  # job id -> the client waiting on it
        self.stdio: dict[int, list[int]] = {}  # job id -> the client's stdin/out/err

    # -- life cycle --------------------------------------------------------------------

    def open(self) -> None:
        """Bind the socket (replacing a stale one) and re-adopt the journal's jobs."""
        path = self.settings.socket
        folder = os.path.dirname(path) or "."
        os.makedirs(folder, mode=0o755, exist_ok=True)
        with contextlib.suppress(FileNotFoundError):
            st = os.lstat(path)
            if not stat.S_ISSOCK(st.st_mode):
                raise UserError(f"{path} exists and is not a socket; refusing to replace it")
            os.unlink(path)
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(path)
        os.chmod(path, 0o666)  # anyone may ask; the kernel says who asked
        listener.listen(128)
        listener.setblocking(False)
        self.listener = listener
        self.selector.register(listener, selectors.EVENT_READ, ("listen", None))
        self.recover()
        log.info("serving on %s", path)

    def close(self) -> None:
        for client in list(self.clients.values()):
            self._drop(client)
        if self.listener is not None:
            self.selector.unregister(self.listener)
            self.listener.close()
            with contextlib.suppress(OSError):
                os.unlink(self.settings.socket)
        for fd in self.watched.values():
            os.close(fd)
        self.watched.clear()
        self.store.close()

    def serve_forever(self) -> None:
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: setattr(self, "stopping", True))
        self.open()
        try:
            while not self.stopping:
                self.step()
        finally:
            self.close()

    def step(self, timeout: Optional[float] = None) -> None:
        """One turn of the loop: wait for events (at most a tick), handle them, plan."""
        if self.dirty:
            self.schedule()
        for key, _ in self.selector.select(self.settings.tick if timeout is None else timeout):
            kind, data = key.data
            if kind == "listen":
                self._accept()
            elif kind == "client":
                self._read(data)
            elif kind == "job":
                self._ended(data)
        self._tick()

    # -- recovery ----------------------------------------------------------------------

    def recover(self) -> None:
        """Find every job of the journal again after a start, a crash or a `kill -9`.

        A STARTING job whose supervisor was never recorded never got the go-ahead: its
        supervisor (if one was forked) exits without running it, so it is queued again.
        A recorded supervisor still alive is watched; when it ends, its exit record
        says how the job ended, and its absence with no marker means it never started.
        """
        for job in self.store.jobs([store.PENDING]):
            if job.attached:  # its client's terminal went with the old service
                self.store.update(
                    job.id,
                    state=store.CANCELLED,
                    ended=time.time(),
                    error="the service restarted before it started; submit it again",
                )
        for job in self.store.jobs([store.STARTING, store.RUNNING]):
            marker = spawn.read_marker(self.exits, str(job.id))
            ended = spawn.read_exit_record(self.exits, str(job.id))
            if ended is not None:
                self._finish(job, ended)
            elif (
                job.supervisor
                and spawn.start_time(job.supervisor) >= 0
                and (marker is None or spawn.alive(marker["supervisor"], marker.get("since", -1)))
            ):
                self.store.update(job.id, pid=(marker or {}).get("pid") or job.pid)
                self._watch(job.id, job.supervisor)
                log.info("re-adopted job %s", job.id)
            elif marker is None:
                self._requeue(job)
            else:
                self._finish(
                    job, spawn.Ended(None, None, "its supervisor died", time.time()), store.LOST
                )
        self.dirty = True

    def _requeue(self, job: store.Job) -> None:
        log.warning("job %s never started before a restart; queued again", job.id)
        from gpuwarden.service.placing import release_leases

        release_leases(self, job)
        self.store.update(
            job.id, state=store.PENDING, gpus=(), started=None, supervisor=None, pid=None
        )

    # -- clients -----------------------------------------------------------------------

    def _accept(self) -> None:
        assert self.listener is not None
        while True:
            try:
                sock, _ = self.listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            if len(self.clients) >= self.settings.max_clients:
                sock.close()  # bounded: a flood of connections cannot exhaust the service
                continue
            try:
                who = peer(sock)
            except UserError as err:
                with contextlib.suppress(OSError):
                    sock.sendall(
                        protocol.encode({"v": protocol.VERSION, "ok": False, "error": str(err)})
                    )
                sock.close()
                continue
            sock.setblocking(False)
            client = _Client(sock, who)
            self.clients[sock.fileno()] = client
            self.selector.register(sock, selectors.EVENT_READ, ("client", client))

    def _read(self, client: _Client) -> None:
        try:
            data, fds, _, _ = socket.recv_fds(client.sock, 65536, 3)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data, fds = b"", []
        client.close_fds()  # descriptors not claimed by the message they came with
        client.fds = list(fds)
        if not data:
            self._drop(client)
            return
        client.seen = time.monotonic()
        try:
            messages = client.decoder.feed(data)
        except protocol.ProtocolError as err:
            self._send(client, {"ok": False, "error": str(err)})
            self._drop(client)
            return
        for message in messages:
            try:
                reply = self.handle(client.who, message, client)
            except UserError as err:
                reply = {"ok": False, "error": str(err)}
            except Exception as err:  # a bug must not take the queue down with it
                log.exception("request %r failed", message.get("op"))
                reply = {"ok": False, "error": f"internal error: {type(err).__name__}"}
            self._send(client, reply)

    def _send(self, client: _Client, reply: dict[str, Any]) -> None:
        reply.setdefault("v", protocol.VERSION)
        try:
            client.sock.sendall(protocol.encode(reply))
        except (BlockingIOError, OSError):
            # A client that does not read its answers is dropped, never waited for.
            self._drop(client)

    def _drop(self, client: _Client) -> None:
        fd = client.sock.fileno()
        if fd in self.clients:
            del self.clients[fd]
            with contextlib.suppress(KeyError, ValueError):
                self.selector.unregister(client.sock)
        client.sock.close()
        client.close_fds()
        if client.job is not None:
            self._detach(client.job)

    def _detach(self, job_id: int) -> None:
        """An attached client went away (its terminal closed, it was killed): its job
        ends too, as a job started from a shell would, and its descriptors are closed."""
        self.attached.pop(job_id, None)
        self.release_stdio(job_id)
        job = self.store.get(job_id)
        if job is None or job.state not in store.ACTIVE:
            return
        log.info("job %s: its attached client left; cancelling it", job_id)
        self._cancel(job)

    def release_stdio(self, job_id: int) -> None:
        for fd in self.stdio.pop(job_id, ()):
            with contextlib.suppress(OSError):
                os.close(fd)

    def notify_attached(self, job_id: int, event: dict[str, Any]) -> None:
        client = self.attached.get(job_id)
        if client is not None:
            self._send(client, {"ok": True, "job": job_id, **event})

    def _tick(self) -> None:
        now = time.monotonic()
        for client in list(self.clients.values()):
            if client.job is None and now - client.seen > self.settings.idle_timeout:
                self._drop(client)
        self._enforce_time_limits()
        if any(True for _ in self.store.jobs([store.PENDING])):
            self.dirty = True  # GPUs freed outside the queue show up on the next plan

    # -- requests ----------------------------------------------------------------------

    def handle(
        self, who: Person, message: Mapping[str, Any], client: Optional[_Client] = None
    ) -> dict[str, Any]:
        op = protocol.op_of(message)
        if op == "hello":
            return {
                "ok": True,
                "version": protocol.VERSION,
                "user": who.name,
                "uid": who.uid,
                "admin": self.settings.admins.include(who),
            }
        if op == "submit":
            return self._submit(who, protocol.submit(message), client)
        if op == "signal":
            (job_id,) = protocol.job_ids([message.get("job")], "job")
            number = protocol.signal_number(message.get("signal"))
            job = self._owned(who, job_id, "signal")
            if job.state == store.PENDING and number in (
                signal.SIGINT,
                signal.SIGTERM,
                signal.SIGHUP,
            ):
                self._cancel(job)
            elif job.pid:
                spawn.signal_job(job.pid, number)
            return {"ok": True}
        if op in ("queue", "jobs"):
            return self._list(who, op, message)
        if op in ("cancel", "hold", "release"):
            return self._act(who, op, protocol.job_ids(message.get("jobs")))
        if op == "logs":
            (job_id,) = protocol.job_ids([message.get("job")], "job")
            job = self._owned(who, job_id, "read the logs of")
            return {"ok": True, "output": job.output, "state": job.state}
        if op == "share":
            return self._share()
        raise protocol.ProtocolError(f"operation {op!r} is not served yet")

    def _submit(
        self, who: Person, sub: protocol.Submit, client: Optional[_Client] = None
    ) -> dict[str, Any]:
        s = self.settings
        stdio: list[int] = []
        if sub.attached:
            stdio = client.take_fds() if client is not None else []
            if len(stdio) != 3 or client is None or client.job is not None:
                for fd in stdio:
                    os.close(fd)
                raise UserError("an attached job needs its client's stdin, stdout and stderr")
        if sub.nice < 0 and not s.admins.include(who):
            raise UserError("only an admin may submit with a negative nice value")
        limit = s.max_jobs_per_user
        if (
            limit is not None
            and not self._exempt(who)
            and self.store.count_active(who.uid) >= limit
        ):
            raise UserError(
                f"you have {limit} jobs queued or running, the most allowed (max_jobs_per_user)"
            )
        too_long = sub.time_limit is None or (
            s.max_time is not None and sub.time_limit > s.max_time
        )
        if s.max_time is not None and not self._exempt(who) and too_long:
            most = scheduling_span(s.max_time)
            raise UserError(f"--time is required and must be at most {most} (max_time)")
        for dep in sub.after:
            if self.store.get(dep) is None:
                raise UserError(f"--after {dep}: no such job")
        request = {k: v for k, v in sub.gpus.__dict__.items() if v not in (None, ())}
        job = self.store.add(
            store.new_job(
                uid=who.uid,
                gid=who.gid,
                user=who.name,
                argv=sub.argv,
                cwd=sub.cwd,
                env=dict(sub.env),
                umask=sub.umask,
                request=request,
                time_limit=sub.time_limit,
                nice=sub.nice,
                held=sub.hold,
                after=sub.after,
                mem=sub.gpus.mem,
                output=sub.output,
            )
        )
        if sub.attached and client is not None:
            self.store.update(job.id, attached=True)
            client.job = job.id
            self.attached[job.id] = client
            self.stdio[job.id] = stdio
        elif job.output is None:
            self.store.update(job.id, output=os.path.join(sub.cwd, f"gpuwarden-{job.id}.out"))
        log.info("job %s submitted by %s: %s", job.id, who.name, " ".join(sub.argv)[:200])
        self.dirty = True
        return {"ok": True, "job": job.id}

    def _exempt(self, who: Person) -> bool:
        return self.settings.admins.include(who)

    def _owned(self, who: Person, job_id: int, action: str) -> store.Job:
        job = self.store.get(job_id)
        if job is None:
            raise UserError(f"no job {job_id}")
        if job.uid != who.uid and not self.settings.admins.include(who):
            raise UserError(
                f"job {job_id} belongs to {job.user}: only its owner or an admin may {action} it"
            )
        return job

    def _act(self, who: Person, op: str, ids: tuple[int, ...]) -> dict[str, Any]:
        verb = {"cancel": "cancel", "hold": "hold", "release": "release"}[op]
        done = []
        for job_id in ids:
            job = self._owned(who, job_id, verb)
            if job.state not in store.ACTIVE:
                raise UserError(f"job {job_id} has ended ({job.state})")
            if op == "cancel":
                self._cancel(job)
            elif job.state != store.PENDING:
                raise UserError(f"job {job_id} is already running; only waiting jobs can be held")
            else:
                self.store.update(job_id, held=(op == "hold"))
            done.append(job_id)
            log.info("%s: job %s by %s", op, job_id, who.name)
        self.dirty = True
        return {"ok": True, "jobs": done}

    def _cancel(self, job: store.Job) -> None:
        if job.state == store.PENDING:
            self.store.update(job.id, state=store.CANCELLED, ended=time.time(), reason=None)
            self._ended_attached(job.id, None)
        elif job.pid:
            spawn.signal_job(job.pid, signal.SIGTERM)
            self.termed.setdefault(job.id, time.monotonic())
            self.store.update(job.id, reason="cancelling")

    def _ended_attached(self, job_id: int, ended: Optional[spawn.Ended]) -> None:
        """Tell an attached client how its job ended, and let go of its descriptors."""
        status = 128 + signal.SIGTERM if ended is None else ended.shell_status
        error = "cancelled before it started" if ended is None else ended.error
        self.notify_attached(job_id, {"event": "ended", "status": status, "error": error})
        client = self.attached.pop(job_id, None)
        if client is not None:
            client.job = None
        self.release_stdio(job_id)

    def _list(self, who: Person, op: str, message: Mapping[str, Any]) -> dict[str, Any]:
        if op == "jobs":
            limit = protocol._int(message.get("limit", 100), "limit", 1, 100000)
            jobs = self.store.jobs(store.ENDED, limit=limit)
        else:
            jobs = self.store.jobs(store.ACTIVE)
        show = self.settings.show_commands or self.settings.admins.include(who)
        now = time.time()
        rows = []
        for job in jobs:
            row = {
                "id": job.id,
                "user": job.user,
                "state": job.state,
                "count": job.count,
                "gpus": list(job.gpus),
                "mem": job.mem,
                "reason": job.reason,
                "submitted": job.submitted,
                "started": job.started,
                "ended": job.ended,
                "time_limit": job.time_limit,
                "held": job.held,
                "after": list(job.after),
                "exit_code": job.exit_code,
                "signal": job.exit_signal,
                "error": job.error,
                "priority": self._priorities.get(job.id),
                "estimated_start": self._estimates.get(job.id),
                "command": list(job.argv) if show or job.uid == who.uid else None,
            }
            if job.started is not None:
                row["elapsed"] = (job.ended or now) - job.started
            rows.append(row)
        return {"ok": True, "jobs": rows}

    def _share(self) -> dict[str, Any]:
        policy = self.settings.policy
        usage = self.store.usage(time.time(), policy.half_life)
        factors = scheduling.fairshare_factors(usage, policy)
        return {
            "ok": True,
            "users": [
                {
                    "user": u,
                    "usage": usage.get(u, 0.0),
                    "share": policy.share(u),
                    "factor": factors[u],
                }
                for u in sorted(factors)
            ],
        }

    # -- scheduling --------------------------------------------------------------------

    def schedule(self) -> None:
        """Plan, and start whatever the plan says starts."""
        from gpuwarden.service.placing import inputs, start_job

        self.dirty = False
        pending = self.store.jobs([store.PENDING])
        if not pending:
            return
        snapshot = self.read_snapshot()
        self.memory = {g.uuid: g.memory_total or 0 for g in snapshot.gpus}
        running = self.store.jobs([store.STARTING, store.RUNNING])
        ended = {j.id: j.state == store.COMPLETED for j in self.store.jobs(store.ENDED, limit=5000)}
        now = time.time()
        gpus, busy, waiting = inputs(snapshot, running, pending, self.settings)
        usage = self.store.usage(now, self.settings.policy.half_life)
        decisions = scheduling.plan(
            gpus,
            busy,
            waiting,
            usage,
            now,
            self.settings.policy,
            finished={str(k): v for k, v in ended.items()},
        )
        self._priorities = {int(d.id): d.priority for d in decisions}
        self._estimates = {int(d.id): d.estimated_start for d in decisions}
        by_id = {j.id: j for j in pending}
        for decision in decisions:
            job = by_id[int(decision.id)]
            if not decision.starts:
                if job.reason != decision.reason:
                    self.store.update(job.id, reason=decision.reason)
                continue
            try:
                started = start_job(self, job, decision.gpus, snapshot)
            except UserError as err:
                log.warning("job %s could not start: %s", job.id, err)
                self.store.update(
                    job.id, state=store.FAILED, error=str(err), ended=time.time(), reason=None
                )
                continue
            if started is not None:
                self._watch(job.id, started.supervisor)

    def _watch(self, job_id: int, pid: int) -> None:
        try:
            fd = os.pidfd_open(pid)
        except ProcessLookupError:
            self._ended(job_id)
            return
        self.watched[job_id] = fd
        self.selector.register(fd, selectors.EVENT_READ, ("job", job_id))

    def _ended(self, job_id: int) -> None:
        fd = self.watched.pop(job_id, None)
        if fd is not None:
            self.selector.unregister(fd)
            os.close(fd)
        job = self.store.get(job_id)
        if job is None or job.state not in (store.STARTING, store.RUNNING):
            return
        if job.supervisor:
            spawn.wait_supervisor(job.supervisor, timeout=0)
        ended = spawn.read_exit_record(self.exits, str(job_id))
        if ended is not None:
            self._finish(job, ended)
        elif spawn.read_marker(self.exits, str(job_id)) is None:
            self._requeue(job)  # its supervisor never had the go-ahead
        else:
            self._finish(
                job, spawn.Ended(None, None, "its supervisor died", time.time()), store.LOST
            )

    def _finish(self, job: store.Job, ended: spawn.Ended, state: Optional[str] = None) -> None:
        if state is None:
            if job.id in self.termed and job.reason == "time limit":
                state = store.TIMEOUT
            elif job.id in self.termed:
                state = store.CANCELLED
            else:
                state = store.COMPLETED if ended.ok else store.FAILED
        now = time.time()
        started = job.started or now
        from gpuwarden.service.placing import release_leases

        release_leases(self, job)
        self.store.update(
            job.id,
            state=state,
            ended=ended.at or now,
            exit_code=ended.code,
            exit_signal=ended.signal,
            error=ended.error,
            reason=None,
        )
        memory = max((self.memory.get(u, 0) for u in job.gpus), default=0)
        self.store.charge(
            job.user,
            scheduling.job_usage(len(job.gpus), (ended.at or now) - started, job.mem, memory),
            now,
            self.settings.policy.half_life,
        )
        self.termed.pop(job.id, None)
        for name in (spawn.exit_record_path, spawn.marker_path):
            with contextlib.suppress(OSError):
                os.unlink(name(self.exits, str(job.id)))
        self._ended_attached(job.id, ended)
        log.info("job %s ended: %s", job.id, state)
        self.dirty = True

    def _enforce_time_limits(self) -> None:
        running = self.store.jobs([store.RUNNING])
        now = time.time()
        for job in running:
            sent = self.termed.get(job.id)
            if sent is not None and job.pid and time.monotonic() - sent >= self.settings.grace:
                spawn.signal_job(job.pid, signal.SIGKILL)  # a cancel or limit ignored SIGTERM
        views = [
            scheduling.Running(str(j.id), j.user, j.gpus, j.started or now, j.mem, j.time_limit)
            for j in running
        ]
        by_id = {j.id: j for j in running}
        for job_id, action in scheduling.overdue(views, now, self.settings.grace):
            job = by_id[int(job_id)]
            if not job.pid:
                continue
            if action == scheduling.TERM and int(job_id) not in self.termed:
                spawn.signal_job(job.pid, signal.SIGTERM)
                self.termed[int(job_id)] = time.monotonic()
                self.store.update(job.id, reason="time limit")
                log.info("job %s past its time limit: SIGTERM", job_id)
            elif action == scheduling.KILL:
                spawn.signal_job(job.pid, signal.SIGKILL)


def scheduling_span(seconds: float) -> str:
    from gpuwarden.leases import format_span

    return format_span(seconds)
