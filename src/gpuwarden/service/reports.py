"""What the queue service reports about itself and its users: a running job's usage
so far (from its cgroup), the exporter's queue statistics, and each user's fair share
(`gpuwarden share`, as sshare): the answers that only read the journal and the cgroups."""

from __future__ import annotations

import time
from typing import Any, Optional

from gpuwarden import scheduling
from gpuwarden.service.tally import WAIT_BUCKETS


def usage_now(service: Any, job_id: int) -> tuple[Optional[float], Optional[int]]:
    """A running job's CPU seconds and peak memory so far, from its cgroup."""
    dirs = service.job_cgroup(job_id)
    if not dirs:
        return None, None
    from gpuwarden.cgroups.accounting import usage_of

    used = usage_of(dirs)
    cpu = used.get("cpu_ns")
    return (None if cpu is None else cpu / 1e9), used.get("memory_peak")


def stats(service: Any) -> dict[str, Any]:
    """What the exporter turns into queue metrics: counts, waits, fair share."""
    tally = service.store.tally()
    return {
        "ok": True,
        "plan": service.pacer.stats(),
        "machine": service.hardware.stats(),
        "journal": {"commits": service.store.commits, "fsyncs": service.store.fsyncs},
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
        "preemptions": [{"user": u, "count": n} for u, n in sorted(service.preempted.items())],
    }


def share(service: Any) -> dict[str, Any]:
    policy = service.settings.policy
    usage = service.store.usage(time.time(), policy.half_life)
    active = {user for per_user in service.store.tally().jobs.values() for user in per_user}
    factors = scheduling.fairshare_factors(usage, policy, active)
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
