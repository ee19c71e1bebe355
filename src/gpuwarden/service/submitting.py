"""`submit`: a job judged against every bound, then journaled.

Every bound is checked against the person the kernel named (SO_PEERCRED), and each
refusal is one line naming it (service.admission, service.limiting). A new job that
may start now wakes a pass at once; one that cannot start before something ends or
is released waits for that (service.pacing).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
from typing import TYPE_CHECKING, Any, Optional

from gpuwarden.base.errors import UserError
from gpuwarden.placement.requestwire import to_wire
from gpuwarden.planning import scheduling
from gpuwarden.queueclient import protocol
from gpuwarden.service import admission, arrays, limiting, store
from gpuwarden.service.attachment import record_client
from gpuwarden.service.identity import Person, peer_credentials

if TYPE_CHECKING:
    from gpuwarden.service.connection import Connection
    from gpuwarden.service.joblife import JobLife

log = logging.getLogger("gpuwarden.serve")


def submit(
    life: JobLife,
    who: Person,
    sub: protocol.Submit,
    client: Optional[Connection] = None,
    judged: Optional[admission.Judged] = None,
) -> dict[str, Any]:
    stdio: list[int] = []
    if sub.attached:
        stdio = client.take_fds() if client is not None else []
        if len(stdio) != 3 or client is None or client.job is not None:
            for fd in stdio:
                os.close(fd)
            raise UserError("an attached job needs its client's stdin, stdout and stderr")
    try:
        return _journal(life, who, sub, client, stdio, judged or admission.Judged())
    except BaseException:  # refused: the client's descriptors are not kept
        for fd in stdio:
            with contextlib.suppress(OSError):
                os.close(fd)
        raise


def _journal(
    life: JobLife,
    who: Person,
    sub: protocol.Submit,
    client: Optional[Connection],
    stdio: list[int],
    judged: admission.Judged,
) -> dict[str, Any]:
    """Judge a submit against every bound, then journal it."""
    s = life.settings
    admission.check_sizes(sub, s)
    array = arrays.expand(sub)
    tasks = 1 if array is None else len(array.tasks)
    never = judged.never_runs(life.machine, sub.gpus, life.reading) if life.machine else None
    if never is not None:
        raise UserError(f"this job could never start here: {never}")
    if sub.nice < 0 and not s.admins.include(who):
        raise UserError("only an admin may submit with a negative nice value")
    timed = limiting.interactive_time(s, who, sub)
    if timed != sub.time_limit:  # service.interactive_time: a hold that asked for none
        sub = dataclasses.replace(sub, time_limit=timed)
    limiting.within_limits(s, life.store, who, sub, tasks, array is not None)
    account = limiting.charged(s, life.store, who, sub, tasks)
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
        found = life.store.get(dep)
        if found is None:
            raise UserError(f"--after {dep}: no such job")
        waiting_on = waiting_on or found.state in store.ACTIVE
    reason = _reason_before_a_pass(life, sub, waiting_on)
    after = arrays.dependencies(life.store, sub.after)
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
    # disk before it is told: the answer to a client waits for the fsync that ends
    # the loop's turn, one for every submit of the turn (Clients.release), else the
    # commit is durable itself. An attached job matters only while its client waits,
    # and its start's durable commit carries it to disk before it runs.
    promised = client is not None and not sub.attached
    if client is not None and promised:
        client.promised = True
    with life.store.transaction(durable=not sub.attached and not promised):
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
            ids = arrays.add(life.store, new, array)
            log.info("array %s of %d tasks submitted by %s", ids[0], tasks, who.name)
            life.pacer.wake()
            return {"ok": True, "job": ids[0], "tasks": tasks, "ids": ids}
        job = life.store.add(new)
        output = None if job.attached else arrays.output_of(job)
        if output is not None and output != job.output:  # sbatch's patterns (%j), the
            life.store.update(job.id, output=output)  # default's id; a plain path stays
    if job.attached and client is not None:
        life.attachments.hold(job.id, client, stdio)
        record_client(life.exits, str(job.id), peer_credentials(client.sock)[0])
    log.info("job %s submitted by %s: %s", job.id, who.name, " ".join(sub.argv)[:200])
    if reason is None:
        life.pacer.wake()  # it may start now (or must be refused now)
    elif reason != scheduling.HELD:  # a held job is planned by no pass: nothing moved
        life.pacer.touch()
    return {"ok": True, "job": job.id}


def _reason_before_a_pass(life: JobLife, sub: protocol.Submit, waiting_on: bool) -> Optional[str]:
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
    free = life.queue.free
    if free is None or free.could_fit(sub.gpus.gpu_count, sub.gpus.mem):
        return None
    if not sub.preemptible and any(j.preemptible for j in life.store.jobs([store.RUNNING])):
        return None  # it may preempt: plan now, so its victims' grace starts now
    return scheduling.RESOURCES
