"""What the queue service reports about itself and its users: a running job's usage
so far (from its cgroup), the exporter's queue statistics, and each user's fair share
(`gpuwarden share`, as sshare): the answers that only read the journal and the cgroups.
Of the jobs' life, what `Reporting` names."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Optional

from gpuwarden.planning import scheduling
from gpuwarden.service.owners import owned
from gpuwarden.service.tally import WAIT_BUCKETS

if TYPE_CHECKING:
    from typing import Protocol

    from gpuwarden.queueclient.protocol import Report
    from gpuwarden.service.digests import Ask, Digesting
    from gpuwarden.service.forker import Forker
    from gpuwarden.service.identity import Person
    from gpuwarden.service.liveconfig import LiveConfig
    from gpuwarden.service.machine import Machine
    from gpuwarden.service.pacing import Pacer
    from gpuwarden.service.queuestate import QueueState
    from gpuwarden.service.sampler import Sampler
    from gpuwarden.service.starting import Starts
    from gpuwarden.service.watching import ServiceWatch
    from gpuwarden.usage.efficiency import GpuUse

    class Reporting(Digesting, Protocol):
        """What the reports need of the jobs' life (`joblife.JobLife` has it)."""

        pacer: Pacer
        starts: Starts
        forker: Forker
        hardware: Machine
        live: LiveConfig
        queue: QueueState
        preempted: dict[str, int]  # preemptions since the start, by the victim's owner
        litter: list[str]
        litter_batches: int
        usage_totals: Optional[dict[tuple[str, str], float]]
        sampler: Optional[Sampler]

        def watcher(self) -> ServiceWatch: ...

        def job_cgroup(self, job_id: int) -> dict[str, str]: ...


def usage_now(service: Reporting, job_id: int) -> tuple[Optional[float], Optional[int]]:
    """A running job's CPU seconds and peak memory so far, from its cgroup."""
    dirs = service.job_cgroup(job_id)
    if not dirs:
        return None, None
    from gpuwarden.cgroups.accounting import usage_of

    used = usage_of(dirs)
    cpu = used.get("cpu_ns")
    return (None if cpu is None else cpu / 1e9), used.get("memory_peak")


def stats(service: Reporting) -> dict[str, Any]:
    """What the exporter turns into queue metrics: counts, waits, fair share."""
    tally = service.store.tally()
    return {
        "ok": True,
        "plan": service.pacer.stats(),
        "starting": service.starts.stats(),
        "forker": service.forker.stats(),
        "machine": service.hardware.stats(),
        "config": service.live.stats(),
        "journal": {
            "commits": service.store.commits,
            "fsyncs": service.store.fsyncs,
            "statements": service.store.statements,
        },
        "litter": {"kept": len(service.litter), "batches": service.litter_batches},
        "jobs": tally.counts(),
        "wait_buckets": [[b, c] for b, c in zip(WAIT_BUCKETS, tally.waits)],
        "wait_sum": tally.wait_sum,
        "wait_count": tally.wait_count,
        "users": share(service)["users"],
        "enforcement": [
            {"policy": p, "action": a, "count": n}
            for (p, a), n in sorted(service.watcher().counts.items())
        ],
        "unleased": service.watcher().unleased,
        "usage": usage_totals(service),
        "preemptions": [{"user": u, "count": n} for u, n in sorted(service.preempted.items())],
    }


def usage_totals(service: Reporting) -> list[dict[str, Any]]:
    """GPU-seconds of every ended run per user and account (the exporter's counters:
    they grow when a run ends), from the journal once, then kept as runs end."""
    if service.usage_totals is None:
        from gpuwarden.service.accounting import totals_by

        service.usage_totals = totals_by(service.store.db)
    return [
        {"user": user, "account": account or None, "gpu_seconds": seconds}
        for (user, account), seconds in sorted(service.usage_totals.items())
    ]


def share(service: Reporting) -> dict[str, Any]:
    policy = service.settings.policy
    usage = service.store.usage(time.time(), policy.half_life)
    active = {user for per_user in service.store.tally().jobs.values() for user in per_user}
    factors = scheduling.fairshare_factors(usage, policy, active)
    return {
        "ok": True,
        "accounts": account_shares(service, policy),
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


def account_shares(service: Reporting, policy: scheduling.Policy) -> list[dict[str, Any]]:
    """Each account's decayed usage, share and factor at fair share's account level
    (none when no account has a share: fair share is then per user only)."""
    from gpuwarden.planning import fairshare

    if not fairshare.two_levels(policy):
        return []
    used = service.store.account_usage(time.time(), policy.half_life)
    policy = dataclasses.replace(policy, account_usage=used)
    factors = fairshare.account_factors(policy)
    totals: dict[str, float] = {}
    for (account, _), value in used.items():
        name = account or fairshare.NO_ACCOUNT
        totals[name] = totals.get(name, 0.0) + value
    return [
        {
            "account": name,
            "usage": totals.get(name, 0.0),
            "share": policy.account_shares.get(name, policy.default_share),
            "factor": factor,
        }
        for name, factor in sorted(factors.items())
    ]


def usage_report(service: Reporting, who: Person, ask: Report) -> dict[str, Any]:
    """`gpuwarden report`: GPU-hours, jobs and waits by user, group, account or job (as
    sreport, every user sees every user's totals, as `share` shows their usage); with
    `waste`, the GPU-hours held idle: an admin sees everyone's, a user their own."""
    from gpuwarden.base.errors import UserError
    from gpuwarden.service import accounting, archive
    from gpuwarden.usage import report as usage

    db = service.store.db
    state = service.settings.state_dir  # keep_history's archives are read too
    if ask.waste:
        admin = service.settings.admins.include(who)
        used = archive.uses(state, ask.since, ask.until)
        rows = accounting.waste_report(
            db, ask.since, ask.until, ask.by, None if admin else who.name, used
        )
        return {"ok": True, "waste": [r._asdict() for r in rows[: usage.MAX_ROWS]]}
    old = archive.runs(state, ask.since, ask.until)
    found = accounting.report(db, ask.since, ask.until, ask.by, ask.per, time.time(), old)
    if len(found) > usage.MAX_ROWS:
        raise UserError(
            f"the report has {len(found)} rows, over the {usage.MAX_ROWS} one answer holds: "
            "narrow --since/--until or choose a longer --per"
        )
    return {"ok": True, "rows": usage.as_dicts(found)}


def efficiency(service: Reporting, who: Person, ids: tuple[int, ...]) -> dict[str, Any]:
    """`gpuwarden eff`: each job's runs and what its GPUs did (its owner's or an
    admin's); a running job's current run from the sampler's memory."""
    from gpuwarden.base.errors import UserError
    from gpuwarden.service import accounting

    out = []
    for job_id in ids:
        job = owned(service.store, service.settings, who, job_id, "see the efficiency of")
        runs = accounting.use_of(service.store.db, job_id)
        ended = service.store.db.execute(
            "SELECT run, started, ended, gpus, gpu_seconds, state FROM runs WHERE job = ? "
            "ORDER BY run",
            (job_id,),
        ).fetchall()
        shown = []
        for run, started, end, gpus, gpu_seconds, state in ended:
            shown.append(_run_row(run, started, end, gpus, gpu_seconds, state, runs.get(run, [])))
        if job.state == "RUNNING" and job.started is not None:
            run = len(ended)
            now = time.time()
            sampled = service.sampler.peek(job_id) if service.sampler is not None else []
            uses = sampled or runs.get(run, [])
            held = len(job.gpus) * (now - job.started)
            shown.append(_run_row(run, job.started, None, len(job.gpus), held, "RUNNING", uses))
        if not shown and job.state not in ("PENDING", "STARTING"):
            raise UserError(f"job {job_id} never ran ({job.state})")
        out.append(
            {
                "id": job.id,
                "user": job.user,
                "account": job.account,
                "state": job.state,
                "mem": job.mem,
                "indices": {u: service.queue.indices.get(u) for u in job.gpus},
                "runs": shown,
            }
        )
    return {"ok": True, "jobs": out}


def _run_row(
    run: int,
    started: float,
    ended: Optional[float],
    gpus: int,
    gpu_seconds: float,
    state: str,
    uses: list[GpuUse],
) -> dict[str, Any]:
    return {
        "run": run,
        "started": started,
        "ended": ended,
        "gpus": gpus,
        "gpu_seconds": gpu_seconds,
        "state": state,
        "use": [u._asdict() for u in uses],
    }


def digest_request(message: Mapping[str, Any]) -> Ask:
    """A `digest` request read (service.digests)."""
    from gpuwarden.service import digests

    return digests.request(message)


def digest(service: Reporting, who: Person, ask: Ask) -> dict[str, Any]:
    """`gpuwarden digest`: a digest now, or a subscription to the weekly one."""
    from gpuwarden.service import digests

    return digests.answer(service, who, ask)
