"""The queue service's metrics: jobs waiting and running per user, how long jobs
waited, each user's fair share, the enforcement watcher's actions and the GPU use
outside any lease — from the service's `stats` answer.

The exporter asks the service once per reading (with the GPUs:
`queueclient.client.read_stats`), so a scrape costs the service one small query
whatever the number of scrapers; the families here are pure functions of that
answer. Without a service only `gpuwarden_queue_service_up 0` is exported, so a
dashboard can tell "no queue here" from "queue empty".
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Optional


def families(stats: Optional[Mapping[str, Any]], host: str) -> list:
    from prometheus_client.core import (
        CounterMetricFamily,
        GaugeMetricFamily,
        HistogramMetricFamily,
    )

    up = GaugeMetricFamily(
        "gpuwarden_queue_service_up",
        "1 when the queue service answered the last reading",
        labels=["hostname"],
    )
    up.add_metric([host], 0 if stats is None else 1)
    out: list = [up]
    if stats is None:
        return out
    jobs = GaugeMetricFamily(
        "gpuwarden_queue_jobs",
        "Jobs in the queue service per state and user",
        labels=["state", "user", "hostname"],
    )
    for state in ("PENDING", "RUNNING"):
        for user, count in sorted((stats.get("jobs") or {}).get(state, {}).items()):
            jobs.add_metric([state.lower(), str(user), host], float(count))
    out.append(jobs)
    buckets = [(_le(b), float(c)) for b, c in stats.get("wait_buckets") or []]
    buckets.append(("+Inf", float(stats.get("wait_count") or 0)))
    waits = HistogramMetricFamily(
        "gpuwarden_queue_wait_seconds",
        "How long each started job waited in the queue",
        labels=["hostname"],
    )
    waits.add_metric([host], buckets, sum_value=float(stats.get("wait_sum") or 0.0))
    out.append(waits)
    factor = GaugeMetricFamily(
        "gpuwarden_user_fairshare_factor",
        "Fair-share factor 2^(-usage/share), 1 = unused",
        labels=["user", "hostname"],
    )
    usage = GaugeMetricFamily(
        "gpuwarden_user_usage_gpu_seconds",
        "Decayed GPU-seconds the user's jobs used",
        labels=["user", "hostname"],
    )
    for row in stats.get("users") or []:
        factor.add_metric([str(row.get("user")), host], float(row.get("factor") or 0.0))
        usage.add_metric([str(row.get("user")), host], float(row.get("usage") or 0.0))
    preempted = CounterMetricFamily(
        "gpuwarden_queue_preemptions",
        "Preemptible jobs the queue service preempted, by their owner",
        labels=["user", "hostname"],
    )
    for row in stats.get("preemptions") or []:
        preempted.add_metric([str(row.get("user")), host], float(row.get("count") or 0))
    out += [factor, usage, preempted, *usage_families(stats, host)]
    return out + enforcement_families(stats, host)


def usage_families(stats: Mapping[str, Any], host: str) -> list:
    """GPU-seconds held by ended runs, per user and per account (docs/usage.md): counters
    a dashboard turns into GPU-hours per day with `increase(...[1d]) / 3600`."""
    from prometheus_client.core import CounterMetricFamily

    users = CounterMetricFamily(
        "gpuwarden_user_gpu_seconds",
        "GPU-seconds held by the user's ended job runs",
        labels=["user", "hostname"],
    )
    accounts = CounterMetricFamily(
        "gpuwarden_account_gpu_seconds",
        "GPU-seconds held by the ended job runs charged to the account ('-': none)",
        labels=["account", "hostname"],
    )
    by_user: dict[str, float] = {}
    by_account: dict[str, float] = {}
    for row in stats.get("usage") or []:
        seconds = float(row.get("gpu_seconds") or 0.0)
        user, account = str(row.get("user")), str(row.get("account") or "-")
        by_user[user] = by_user.get(user, 0.0) + seconds
        by_account[account] = by_account.get(account, 0.0) + seconds
    for user, seconds in sorted(by_user.items()):
        users.add_metric([user, host], seconds)
    for account, seconds in sorted(by_account.items()):
        accounts.add_metric([account, host], seconds)
    return [users, accounts]


def enforcement_families(stats: Mapping[str, Any], host: str) -> list:
    """What the service's enforcement watcher did (counters by policy and action: warn,
    notify, kill, report, release) and the GPU use it sees outside any lease now."""
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

    actions = CounterMetricFamily(
        "gpuwarden_enforcement_actions",
        "Enforcement actions the queue service took, by policy and action",
        labels=["policy", "action", "hostname"],
    )
    for row in stats.get("enforcement") or []:
        actions.add_metric(
            [str(row.get("policy")), str(row.get("action")), host], float(row.get("count") or 0)
        )
    unleased = GaugeMetricFamily(
        "gpuwarden_unleased_processes",
        "GPU processes that belong to no lease, per user and GPU",
        labels=["user", "gpu", "hostname"],
    )
    seen: dict[tuple[str, str], int] = {}
    for row in stats.get("unleased") or []:
        key = (str(row.get("user") or "?"), str(row.get("index")))
        seen[key] = seen.get(key, 0) + 1
    for (user, gpu), count in sorted(seen.items()):
        unleased.add_metric([user, gpu, host], float(count))
    return [actions, unleased]


def _le(bound: float) -> str:
    return f"{float(bound):g}"
