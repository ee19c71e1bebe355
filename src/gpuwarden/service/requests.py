"""The service's answers to requests: who may do what, and what each operation does.

Every rule is checked against the person the kernel named (SO_PEERCRED), and
every refusal is one line naming the rule. Over the state of service.core, with
the job's life beneath it (service.lifecycle), and the functions it hands requests
to (service.limiting, service.attaching, service.reloading, service.reports).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
import os
import signal
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Optional

from gpuwarden.base.errors import UserError
from gpuwarden.planning import scheduling
from gpuwarden.queueclient import protocol
from gpuwarden.queueclient.requestwire import to_wire
from gpuwarden.service import (
    admission,
    argvsubmit,
    arrays,
    attaching,
    bookings,
    jobprocess,
    joining,
    limiting,
    listing,
    reloading,
    reports,
    requeue,
    store,
    unwritten,
)
from gpuwarden.service.attachment import record_client
from gpuwarden.service.identity import Person, peer_credentials, person
from gpuwarden.service.lifecycle import Lifecycle

if TYPE_CHECKING:
    from gpuwarden.service.connection import Connection

log = logging.getLogger("gpuwarden.serve")

#: An operation's handler: (the service, the caller, its request's record, its connection).
Handler = Callable[[Any, Person, Any, "Optional[Connection]"], dict[str, Any]]


def client_wheels() -> Optional[str]:
    """The folder of wheels `scripts/install-system` keeps beside the service's own
    install (this very release and its dependencies), from which a user puts gpuwarden
    into their own venv; None where it made none."""
    import sys

    folder = os.path.join(sys.prefix, "share", "gpuwarden", "wheels")
    return folder if os.path.isdir(folder) else None


class Requests(Lifecycle):
    def handle(
        self, who: Person, message: Mapping[str, Any], client: Optional[Connection] = None
    ) -> dict[str, Any]:
        """One request answered: its operation names the handler (OPERATIONS), the
        protocol reads its fields into one record, and the handler answers it."""
        op = protocol.op_of(message)
        served = OPERATIONS.get(op)
        if served is None:
            raise protocol.ProtocolError(f"operation {op!r} is not served yet")
        decode, handler = served
        answer = handler(self, who, decode(message), client)
        if op in ("hello", "submit"):  # a client of another release says so (client.py)
            from gpuwarden import __version__

            answer["release"] = __version__
        return answer

    # -- one handler per operation: (the caller, its request's record, its connection) --

    def _hello(self, who: Person, _: None, client: Optional[Connection]) -> dict[str, Any]:
        return {
            "ok": True,
            "version": protocol.VERSION,
            "user": who.name,
            "uid": who.uid,
            "admin": self.settings.admins.include(who),
            "wheels": client_wheels(),
        }

    def _signal_job(
        self, who: Person, ask: protocol.Signal, client: Optional[Connection]
    ) -> dict[str, Any]:
        self._signal(self._owned(who, ask.job, "signal"), ask.number)
        return {"ok": True}

    def _cancel_jobs(
        self, who: Person, names: tuple[arrays.Name, ...], client: Optional[Connection]
    ) -> dict[str, Any]:
        return self._act(who, "cancel", names)

    def _hold(
        self, who: Person, names: tuple[arrays.Name, ...], client: Optional[Connection]
    ) -> dict[str, Any]:
        return self._act(who, "hold", names)

    def _release(
        self, who: Person, names: tuple[arrays.Name, ...], client: Optional[Connection]
    ) -> dict[str, Any]:
        return self._act(who, "release", names)

    def _logs(self, who: Person, job_id: int, client: Optional[Connection]) -> dict[str, Any]:
        job = self._owned(who, job_id, "read the logs of")
        return {
            "ok": True,
            "output": job.output,
            "state": job.state,
            "uid": job.uid,
            "attached": job.attached,
            "error": job.error,  # why it never started (the owner's or an admin's)
        }

    def _book_request(self, who: Person, op: str, message: Mapping[str, Any]) -> dict[str, Any]:
        """GPUs booked ahead: `book`, `bookings` and `unbook` (service.bookings reads
        their fields)."""
        usable = len(self.queue.indices) or len(getattr(self.machine, "gpus", ()) or ())
        answer = bookings.handle(bookings.of(self), self.settings, usable, who, op, message)
        if op != "bookings":
            self.pacer.wake()  # kept GPUs are freed or taken: plan again
        return answer

    def _ask_requeue(
        self, who: Person, job_id: int, client: Optional[Connection]
    ) -> dict[str, Any]:
        """Run it again: now if it has ended, once it ends if it runs (service.requeue)."""
        requeue.ask(self, self._owned(who, job_id, "requeue"))
        return {"ok": True}

    def _submit(
        self, who: Person, sub: protocol.Submit, client: Optional[Connection] = None
    ) -> dict[str, Any]:
        stdio: list[int] = []
        if sub.attached:
            stdio = client.take_fds() if client is not None else []
            if len(stdio) != 3 or client is None or client.job is not None:
                for fd in stdio:
                    os.close(fd)
                raise UserError("an attached job needs its client's stdin, stdout and stderr")
        try:
            return self._journal(who, sub, client, stdio)
        except BaseException:  # refused: the client's descriptors are not kept
            for fd in stdio:
                with contextlib.suppress(OSError):
                    os.close(fd)
            raise

    def _journal(
        self, who: Person, sub: protocol.Submit, client: Optional[Connection], stdio: list[int]
    ) -> dict[str, Any]:
        """Judge a submit against every bound, then journal it."""
        s = self.settings
        admission.check_sizes(sub, s)
        array = arrays.expand(sub)
        tasks = 1 if array is None else len(array.tasks)
        never = admission.never_runs(self.machine, sub.gpus, self.reading) if self.machine else None
        if never is not None:
            raise UserError(f"this job could never start here: {never}")
        if sub.nice < 0 and not s.admins.include(who):
            raise UserError("only an admin may submit with a negative nice value")
        timed = limiting.interactive_time(self.settings, who, sub)
        if timed != sub.time_limit:  # service.interactive_time: a hold that asked for none
            sub = dataclasses.replace(sub, time_limit=timed)
        limiting.within_limits(self.settings, self.store, who, sub, tasks, array is not None)
        account = limiting.charged(self.settings, self.store, who, sub, tasks)
        if sub.warning is not None and sub.time_limit is None and not sub.preemptible:
            raise UserError("--signal needs --time: its signal comes that long before the limit")
        if sub.attached and sub.max_retries:
            raise UserError("--max-retries is for batch jobs: an attached job is not run again")
        if sub.attached and sub.preemptible and sub.preempt == "requeue":
            raise UserError(
                "an attached job cannot be queued again: a preemptible one needs --preempt=cancel"
            )
        waiting_on = False
        for dep in sub.after:
            found = self.store.get(dep)
            if found is None:
                raise UserError(f"--after {dep}: no such job")
            waiting_on = waiting_on or found.state in store.ACTIVE
        reason = self._reason_before_a_pass(sub, waiting_on)
        after = arrays.dependencies(self.store, sub.after)
        request: dict[str, Any] = dict(to_wire(sub.gpus))
        if sub.warning is not None:
            request["signal"] = list(sub.warning)  # beside its GPU wishes: what it asked for
        if sub.max_retries:
            request["max_retries"] = sub.max_retries
        if sub.preemptible:  # how it yields (service.preempting)
            request["preemptible"], request["preempt"] = True, sub.preempt
        if sub.notify:  # likewise its own notifications (service.jobnotify)
            if sub.notify_url is None:
                raise UserError("--notify needs a webhook to post to (submit.webhook)")
            request["notify"] = {"events": list(sub.notify), "url": sub.notify_url}
        # The job and its output path: one commit. A batch job's id is a promise, on
        # disk before it is told; an attached job matters only while its client waits,
        # and its start's durable commit carries it to disk before it runs.
        with self.store.transaction(durable=not sub.attached):
            new = store.new_job(
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
                reason=reason,
                after=after,
                mem=sub.gpus.mem,
                output=sub.output,
                attached=sub.attached and client is not None,
                wait=sub.wait,
                begin=sub.begin,
                account=account,
            )
            if array is not None:
                ids = arrays.add(self.store, new, array)
                log.info("array %s of %d tasks submitted by %s", ids[0], tasks, who.name)
                self.pacer.wake()
                return {"ok": True, "job": ids[0], "tasks": tasks, "ids": ids}
            job = self.store.add(new)
            if not job.attached:  # sbatch's patterns (%j) filled in, as for an array's tasks
                self.store.update(job.id, output=arrays.output_of(job))
        if job.attached and client is not None:
            self.attachments.hold(job.id, client, stdio)
            record_client(self.exits, str(job.id), peer_credentials(client.sock)[0])
        log.info("job %s submitted by %s: %s", job.id, who.name, " ".join(sub.argv)[:200])
        if reason is None:
            self.pacer.wake()  # it may start now (or must be refused now)
        else:
            self.pacer.touch()
        return {"ok": True, "job": job.id}

    def _reason_before_a_pass(self, sub: protocol.Submit, waiting_on: bool) -> Optional[str]:
        """None when a new job may start now (or, without --wait, must be refused now):
        plan at once. Otherwise why it waits, as the next pass would most likely say
        (which corrects it): it cannot start before something ends or is released,
        which wakes a pass anyway, so a deep queue's submit does not pay for a pass
        over every waiting job (service.pacing)."""
        if not sub.wait:
            return None
        if sub.hold:
            return scheduling.HELD
        if waiting_on:
            return scheduling.DEPENDENCY
        free = self.queue.free
        if free is None or free.could_fit(sub.gpus.gpu_count, sub.gpus.mem):
            return None
        if not sub.preemptible and any(j.preemptible for j in self.store.jobs([store.RUNNING])):
            return None  # it may preempt: plan now, so its victims' grace starts now
        return scheduling.RESOURCES

    def _signal(self, job: store.Job, number: int) -> None:
        """A signal for a job, judged by its state: a waiting job is cancelled by INT, TERM
        or HUP (as a job started from a shell would end) and gets no other; an ended or
        starting job gets none; a running one gets it through the pidfd of its first
        process, never by its stored pid number, which another process may have now."""
        if job.state in store.ENDED:
            raise UserError(f"job {job.id} has ended ({job.state}): there is nothing to signal")
        if job.state == store.PENDING:
            if number not in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
                raise UserError(
                    f"job {job.id} has not started: only INT, TERM or HUP (which cancel it) "
                    "may be sent to it"
                )
            self._cancel(job, number)
            return
        pidfd = self.processes.get(job.id)
        if (
            job.state != store.RUNNING
            or pidfd is None
            or not job.pid
            or not jobprocess.signal_group(pidfd, job.pid, number)
        ):
            raise UserError(f"job {job.id} has no process to signal now ({job.state.lower()})")

    def _is_admin_uid(self, uid: int) -> bool:
        try:
            return self.settings.admins.include(person(uid))
        except UserError:
            return False

    def _exempt(self, who: Person) -> bool:
        return self.settings.admins.include(who)

    def _owned(self, who: Person, job_id: int, action: str) -> store.Job:
        job = self.store.get(job_id)
        if job is None:
            raise UserError(f"no job {job_id}")
        if not mine(job, who) and not self.settings.admins.include(who):
            raise UserError(
                f"job {job_id} belongs to {job.user}: only its owner or an admin may {action} it"
            )
        return job

    def _act(self, who: Person, op: str, names: tuple[arrays.Name, ...]) -> dict[str, Any]:
        """Cancel, hold or release each job it may, and say which were refused and why:
        one refused id does not stop the others. Nothing done at all is an error. An
        array's id names its tasks not yet ended (holding it holds those that wait),
        `12_7` one task (service.arrays)."""
        verb = {"cancel": "cancel", "hold": "hold", "release": "release"}[op]
        done: list[int] = []
        labels: list[str] = []
        refused: list[dict[str, Any]] = []
        for name in dict.fromkeys(names):
            shown = name if isinstance(name, int) else "_".join(map(str, name))
            try:
                label, jobs = arrays.named(self.store, name)
                # An array and its tasks named together (`cancel --me` lists both): a
                # task this request has acted on already is done, not "has ended".
                jobs = [j for j in jobs if j.id not in done]
                if not jobs:
                    continue
                owner = jobs[0]
                if owner.uid != who.uid and not self.settings.admins.include(who):
                    raise UserError(
                        f"job {label} belongs to {owner.user}: only its owner or an admin "
                        f"may {verb} it"
                    )
                whole = len(jobs) > 1 or (isinstance(name, int) and owner.array_job == name)
                if whole and op != "cancel":  # holding an array holds what still waits
                    jobs = [j for j in jobs if j.state == store.PENDING]
                act = functools.partial(self._act_on, op, label=None if whole else label)
                acted = unwritten.each(self, op == "cancel", jobs, act)  # one commit
                if not acted:
                    raise UserError(f"array {label} has no waiting task to {verb}")
            except UserError as err:
                refused.append({"id": shown, "error": str(err)})
                continue
            done.extend(acted)
            labels.append(label)
            log.info("%s: job %s by %s", op, label, who.name)
        self.pacer.wake()  # a release or a cancel may start a job
        self.pacer.touch()  # a hold changes a reason no start pass looks at
        if not done:
            said = "; ".join(r["error"] for r in refused[:5])
            raise UserError(said + (f"; and {len(refused) - 5} more" if len(refused) > 5 else ""))
        return {"ok": True, "jobs": done, "names": labels, "refused": refused}

    def _act_on(self, op: str, job: store.Job, label: Optional[str]) -> None:
        label = label or arrays.label_of(job)  # an array's task by its own
        if job.state not in store.ACTIVE:
            raise UserError(f"job {label} has ended ({job.state})")
        if op == "cancel":
            self._cancel(job)
        elif job.state != store.PENDING:
            raise UserError(f"job {label} is already running; only waiting jobs can be held")
        else:
            self.store.update(job.id, held=(op == "hold"))

    def _jobs(
        self, who: Person, ask: protocol.Listing, client: Optional[Connection]
    ) -> dict[str, Any]:
        """A page of the history (service.listing): the store skips to the offset and
        stops at the limit, never more than fits in one answer."""
        from gpuwarden.service.accounting import totals

        jobs, total = self.store.history(ask.limit, ask.offset, ask.user, ask.ids)

        def row(job: store.Job) -> dict[str, Any]:  # only those the page takes
            shaped = self._row(who, job)
            ran = totals(self.store.db, [job.id])  # every run of a requeued job
            if job.id in ran:
                shaped["runs"], shaped["run_seconds"], shaped["gpu_seconds"] = ran[job.id]
            return shaped

        return listing.page(jobs, ask, total, row)

    def _queue(
        self, who: Person, ask: protocol.Listing, client: Optional[Connection]
    ) -> dict[str, Any]:
        """A page of the queue (service.listing): never more than fits in one answer,
        however many jobs there are."""
        key = (self.store.version, self.pacer.count)
        self.listed = listing.kept(self.listed, key, self.store, ask, self.queue.priorities)
        ordered = self.listed[1]
        if ask.arrays:  # an array's waiting tasks in one row (service.arrays)
            rows = arrays.grouped(ordered)
            reply = listing.page(
                rows[ask.offset :],
                ask,
                len(rows),
                lambda r: self._row(who, r[0]) | arrays.row_fields(*r),
            )
        else:
            reply = listing.page(
                ordered[ask.offset :], ask, len(ordered), lambda j: self._row(who, j)
            )
        reply["unleased"] = self.watcher().unleased  # GPU use outside the queue, for its header
        reply.update(bookings.for_queue(bookings.of(self), time.time()))  # at most 10 lines
        return reply

    def _row(self, who: Person, job: store.Job) -> dict[str, Any]:
        """One job as `queue` and `jobs` answer it."""
        show = self.settings.show_commands or self.settings.admins.include(who)
        row = {
            "id": job.id,
            "user": job.user,
            "account": job.account,
            "state": job.state,
            "count": job.count,
            "gpus": list(job.gpus),
            "indices": [self.queue.indices.get(u) for u in job.gpus],
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
            "preemptible": job.preemptible,
            "restarts": job.restarts,
            "preemptions": job.preemptions,
            # A start error can quote the command or a private path: as the command.
            "error": job.error if show or mine(job, who) else None,
            "priority": self.queue.priorities.get(job.id),
            "estimated_start": (
                self.queue.expected_start(job.id) if job.state == store.PENDING else None
            ),
            "command": listing.command(job.argv) if show or mine(job, who) else None,
        }
        if job.array_job is not None:
            row.update(arrays.row_fields(job, ()))
        if job.started is not None:
            row["elapsed"] = (job.ended or time.time()) - job.started
        row["cpu_seconds"], row["mem_peak"] = job.cpu_seconds, job.mem_peak
        if job.state == store.RUNNING:
            row["cpu_seconds"], row["mem_peak"] = reports.usage_now(self, job.id)
        return row


#: Each operation: how its request is read into one record (protocol), and its handler,
#: called with the service, the caller the kernel named, that record and the caller's
#: connection. Some are written with their concern (attach, limits, reload).
OPERATIONS: dict[str, tuple[Callable[[Mapping[str, Any]], Any], Handler]] = {
    "hello": (protocol.nothing, Requests._hello),
    "submit": (protocol.submit, Requests._submit),
    "signal": (protocol.signalling, Requests._signal_job),
    "queue": (protocol.listing, Requests._queue),
    "jobs": (protocol.listing, Requests._jobs),
    "cancel": (protocol.jobs_named, Requests._cancel_jobs),
    "hold": (protocol.jobs_named, Requests._hold),
    "release": (protocol.jobs_named, Requests._release),
    "logs": (protocol.one_job, Requests._logs),
    "book": (dict, lambda service, who, message, _: service._book_request(who, "book", message)),
    "bookings": (dict, lambda svc, who, msg, _: svc._book_request(who, "bookings", msg)),
    "unbook": (dict, lambda svc, who, msg, _: svc._book_request(who, "unbook", msg)),
    "join": (dict, joining.join),  # a kernel into its allocation's cgroup
    "requeue": (protocol.one_job, Requests._ask_requeue),
    "stats": (protocol.nothing, lambda service, who, _, client: reports.stats(service)),
    "share": (protocol.nothing, lambda service, who, _, client: reports.share(service)),
    "reload": (protocol.nothing, reloading.reload_by),
    "limits": (
        protocol.nothing,
        lambda svc, who, _, client: limiting.limits_answer(svc.settings, svc.store, who),
    ),
    "attach": (protocol.one_job, attaching.attach),
    "report": (protocol.report, reports.usage_report),
    "eff": (protocol.eff_jobs, reports.efficiency),
    "digest": (reports.digest_request, reports.digest),
    "submit_argv": (dict, argvsubmit.submit_argv),  # the short client's command line
}


def mine(job: store.Job, who: Person) -> bool:
    """Whether `who` owns `job`: the same uid and the same name. A uid given to a new
    account after its old user left must not inherit the old user's jobs, commands
    and logs from the journal (an admin still sees them)."""
    return job.uid == who.uid and job.user == who.name


def scheduling_span(seconds: float) -> str:
    from gpuwarden.base.units import format_span

    return format_span(seconds)
