"""The service's answers to requests: one function per operation, in one table.

`handle` reads a request's operation, has the protocol read its fields into one
record (queueclient.protocol) and calls the operation's function with the request's
`Context` (service.context: the jobs' life, how the service was started), the
person the kernel named (SO_PEERCRED) and the caller's connection. Every refusal is
one line naming the rule. The functions of their own concern live with it: submit
(service.submitting), the `queue` and `jobs` pages (service.rows), attach, limits,
reload, join, reports, digests and bookings.
"""

from __future__ import annotations

import functools
import logging
import os
import signal
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Optional

from gpuwarden.base.errors import UserError
from gpuwarden.planning import scheduling
from gpuwarden.queueclient import protocol
from gpuwarden.service import (
    argvsubmit,
    arrays,
    attaching,
    bookings,
    jobprocess,
    joining,
    limiting,
    listing,
    queuetext,
    reloading,
    reports,
    requeue,
    rows,
    store,
    submitting,
    unwritten,
)
from gpuwarden.service.context import Context
from gpuwarden.service.owners import owned

if TYPE_CHECKING:
    from gpuwarden.service.connection import Connection
    from gpuwarden.service.identity import Person
    from gpuwarden.service.joblife import JobLife

log = logging.getLogger("gpuwarden.serve")


#: An operation's function: (the request's context, the caller, its request's record,
#: its connection) -> the answer.
Handler = Callable[[Context, "Person", Any, "Optional[Connection]"], dict[str, Any]]


def handle(
    ctx: Context, who: Person, message: Mapping[str, Any], client: Optional[Connection] = None
) -> dict[str, Any]:
    """One request answered: its operation names the handler (OPERATIONS), the
    protocol reads its fields into one record, and the handler answers it."""
    op = protocol.op_of(message)
    served = OPERATIONS.get(op)
    if served is None:
        raise protocol.ProtocolError(f"operation {op!r} is not served yet")
    decode, handler = served
    answer = handler(ctx, who, decode(message), client)
    if op in ("hello", "submit"):  # a client of another release says so (client.py)
        from gpuwarden import __version__

        answer["release"] = __version__
    return answer


def client_wheels() -> Optional[str]:
    """The folder of wheels `scripts/install-system` keeps beside the service's own
    install (this very release and its dependencies), from which a user puts gpuwarden
    into their own venv; None where it made none."""
    import sys

    folder = os.path.join(sys.prefix, "share", "gpuwarden", "wheels")
    return folder if os.path.isdir(folder) else None


def _hello(ctx: Context, who: Person, _: None, client: Optional[Connection]) -> dict[str, Any]:
    return {
        "ok": True,
        "version": protocol.VERSION,
        "user": who.name,
        "uid": who.uid,
        "admin": ctx.life.settings.admins.include(who),
        "wheels": client_wheels(),
    }


def _owned(life: JobLife, who: Person, job_id: int, action: str) -> store.Job:
    return owned(life.store, life.settings, who, job_id, action)


def _signal_job(
    ctx: Context, who: Person, ask: protocol.Signal, client: Optional[Connection]
) -> dict[str, Any]:
    _signal(ctx.life, _owned(ctx.life, who, ask.job, "signal"), ask.number)
    return {"ok": True}


def _acting(op: str) -> Handler:
    """`cancel`, `hold` or `release` of the jobs a request names (`_act`)."""

    def answer(
        ctx: Context, who: Person, names: tuple[arrays.Name, ...], _: Optional[Connection]
    ) -> dict[str, Any]:
        return _act(ctx.life, who, op, names)

    return answer


def _logs(ctx: Context, who: Person, job_id: int, client: Optional[Connection]) -> dict[str, Any]:
    job = _owned(ctx.life, who, job_id, "read the logs of")
    return {
        "ok": True,
        "output": job.output,
        "state": job.state,
        "uid": job.uid,
        "attached": job.attached,
        "error": job.error,  # why it never started (the owner's or an admin's)
    }


def _booking(op: str) -> Handler:
    """GPUs booked ahead: `book`, `bookings` and `unbook` (service.bookings reads
    their fields)."""

    def answer(
        ctx: Context, who: Person, message: Mapping[str, Any], _: Optional[Connection]
    ) -> dict[str, Any]:
        life = ctx.life
        usable = len(life.queue.indices) or len(life.machine.gpus if life.machine else ())
        reply = bookings.handle(life.bookings(), life.settings, usable, who, op, message)
        if op != "bookings":
            life.pacer.wake()  # kept GPUs are freed or taken: plan again
        return reply

    return answer


def _ask_requeue(
    ctx: Context, who: Person, job_id: int, client: Optional[Connection]
) -> dict[str, Any]:
    """Run it again: now if it has ended, once it ends if it runs (service.requeue)."""
    requeue.ask(ctx.life, _owned(ctx.life, who, job_id, "requeue"))
    return {"ok": True}


def _submit(
    ctx: Context, who: Person, sub: protocol.Submit, client: Optional[Connection]
) -> dict[str, Any]:
    return submitting.submit(ctx.life, who, sub, client, ctx.judged)


def _jobs(
    ctx: Context, who: Person, ask: protocol.Listing, client: Optional[Connection]
) -> dict[str, Any]:
    return rows.history(ctx.life, who, ask)


def _queue(
    ctx: Context, who: Person, ask: protocol.Listing, client: Optional[Connection]
) -> dict[str, Any]:
    """A page of the queue: its order kept while neither the journal nor the plan
    moved (service.listing)."""
    life = ctx.life
    key = (life.store.version, life.pacer.count)
    ctx.listed = listing.kept(ctx.listed, key, life.store, ask, life.queue.priorities)
    if ask.table:  # the table's lines, from cells kept ready (service.queuetext)
        return rows.headed(life, queuetext.answer(ctx.text, life, who, ask, key, ctx.listed[1]))
    return rows.queue(life, who, ask, ctx.listed[1])


def _signal(life: JobLife, job: store.Job, number: int) -> None:
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
        life.cancel(job, number)
        return
    pidfd = life.processes.get(job.id)
    if (
        job.state != store.RUNNING
        or pidfd is None
        or not job.pid
        or not jobprocess.signal_group(pidfd, job.pid, number)
    ):
        raise UserError(f"job {job.id} has no process to signal now ({job.state.lower()})")


def _act(life: JobLife, who: Person, op: str, names: tuple[arrays.Name, ...]) -> dict[str, Any]:
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
            label, jobs = arrays.named(life.store, name)
            # An array and its tasks named together (`cancel --me` lists both): a
            # task this request has acted on already is done, not "has ended".
            jobs = [j for j in jobs if j.id not in done]
            if not jobs:
                continue
            owner = jobs[0]
            if owner.uid != who.uid and not life.settings.admins.include(who):
                raise UserError(
                    f"job {label} belongs to {owner.user}: only its owner or an admin may {verb} it"
                )
            whole = len(jobs) > 1 or (isinstance(name, int) and owner.array_job == name)
            if whole and op != "cancel":  # holding an array holds what still waits
                jobs = [j for j in jobs if j.state == store.PENDING]
            act = functools.partial(_act_on, life, op, label=None if whole else label)
            acted = unwritten.each(life, op == "cancel", jobs, act)  # one commit
            if not acted:
                raise UserError(f"array {label} has no waiting task to {verb}")
        except UserError as err:
            refused.append({"id": shown, "error": str(err)})
            continue
        done.extend(acted)
        labels.append(label)
        log.info("%s: job %s by %s", op, label, who.name)
    life.pacer.wake()  # a release or a cancel may start a job
    life.pacer.touch()  # the others' priorities: a held job's is gone
    if not done:
        said = "; ".join(r["error"] for r in refused[:5])
        raise UserError(said + (f"; and {len(refused) - 5} more" if len(refused) > 5 else ""))
    return {"ok": True, "jobs": done, "names": labels, "refused": refused}


def _act_on(life: JobLife, op: str, job: store.Job, label: Optional[str]) -> None:
    label = label or arrays.label_of(job)  # an array's task by its own
    if job.state not in store.ACTIVE:
        raise UserError(f"job {label} has ended ({job.state})")
    if op == "cancel":
        life.cancel(job)
    elif job.state != store.PENDING:
        raise UserError(f"job {label} is already running; only waiting jobs can be held")
    elif op == "hold":  # its reason now: no pass plans a held job
        life.store.update(job.id, held=True, reason=scheduling.HELD)
    else:
        life.store.update(job.id, held=False)


#: Each operation: how its request is read into one record (protocol), and its handler,
#: called with the request's context, the caller the kernel named, that record and the
#: caller's connection. Some are written with their concern (attach, limits, reload).
OPERATIONS: dict[str, tuple[Callable[[Mapping[str, Any]], Any], Handler]] = {
    "hello": (protocol.nothing, _hello),
    "submit": (protocol.submit, _submit),
    "signal": (protocol.signalling, _signal_job),
    "queue": (protocol.listing, _queue),
    "jobs": (protocol.listing, _jobs),
    "cancel": (protocol.jobs_named, _acting("cancel")),
    "hold": (protocol.jobs_named, _acting("hold")),
    "release": (protocol.jobs_named, _acting("release")),
    "logs": (protocol.one_job, _logs),
    "book": (dict, _booking("book")),
    "bookings": (dict, _booking("bookings")),
    "unbook": (dict, _booking("unbook")),
    "join": (dict, lambda ctx, who, message, client: joining.join(ctx.life, who, message, client)),
    "requeue": (protocol.one_job, _ask_requeue),
    "stats": (protocol.nothing, lambda ctx, who, _, client: reports.stats(ctx.life)),
    "share": (protocol.nothing, lambda ctx, who, _, client: reports.share(ctx.life)),
    "reload": (
        protocol.nothing,
        lambda ctx, who, _, client: reloading.reload_by(ctx.life, ctx.started, who),
    ),
    "limits": (
        protocol.nothing,
        lambda ctx, who, _, client: limiting.limits_answer(ctx.life.settings, ctx.life.store, who),
    ),
    "attach": (
        protocol.one_job,
        lambda ctx, who, job_id, client: attaching.attach(ctx.life, who, job_id, client),
    ),
    "report": (protocol.report, lambda ctx, who, ask, _: reports.usage_report(ctx.life, who, ask)),
    "eff": (protocol.eff_jobs, lambda ctx, who, ids, _: reports.efficiency(ctx.life, who, ids)),
    "digest": (reports.digest_request, lambda ctx, who, ask, _: reports.digest(ctx.life, who, ask)),
    "submit_argv": (dict, argvsubmit.submit_argv),  # the short client's command line
}
