"""Real components: Debian's Prometheus scrapes the exporter on the simulated server,
and promtool accepts the shipped alert rules.

Skipped with the reason when prometheus/promtool are absent, unless
GPUWARDEN_REQUIRE_COMPONENTS=1 (CI), where a missing component is a failure.
"""

from __future__ import annotations

import json
import subprocess

import pytest

from scraping import DEPLOY, component, get_json, prometheus_scraping, query
from waiting import wait_for


def test_promtool_accepts_alert_rules():
    promtool = component("promtool")
    done = subprocess.run(
        [promtool, "check", "rules", str(DEPLOY / "gpuwarden-alerts.yml")],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS" in done.stdout


def test_promtool_unit_tests_of_the_alert_rules_pass():
    """deploy/gpuwarden-alerts.test.yml: among others, the first fatal XID on a GPU
    alerts (the per-code series is born at 1, which increase() cannot see)."""
    promtool = component("promtool")
    done = subprocess.run(
        [promtool, "test", "rules", "gpuwarden-alerts.test.yml"],
        cwd=DEPLOY,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS" in done.stdout


# Series that appear with their first event, already past 0: increase()/rate()/delta()
# over them misses that first event, so alerts and panels must not use them so.
BORN_AT_FIRST_EVENT = ("gpuwarden_gpu_xid_errors_total",)


def test_no_alert_or_panel_takes_the_increase_of_a_series_born_at_its_first_event():
    import re

    rules_text = (DEPLOY / "gpuwarden-alerts.yml").read_text()
    # every `expr:` in the rules file is on one line (promtool check rules reads the same)
    rules = dict(re.findall(r"- alert: (\w+)\n\s+expr: (.+)", rules_text))
    assert len(rules) == rules_text.count("- alert:")
    dashboard = json.loads((DEPLOY / "grafana-dashboard.json").read_text())
    exprs = list(rules.values())
    exprs += [t["expr"] for p in dashboard["panels"] for t in p.get("targets", []) if "expr" in t]
    assert any("xid" in e for e in exprs)
    for expr in exprs:
        for name in BORN_AT_FIRST_EVENT:
            assert not re.search(rf"\b(increase|rate|irate|delta|idelta)\(\s*{name}\b", expr), expr
    # fatal per the exporter's health.fatal_xids, not a list copied into the rule
    assert "xid_events_total" in rules["GpuFatalXid"] and "xid=~" not in rules["GpuFatalXid"]


def test_dashboard_queries_only_exported_metrics():
    import re

    from gpuwarden.exporter.metrics import View, render
    from gpuwarden.machine.inventory import Gpu, Snapshot

    exported = set()
    text = render(View(Snapshot(0.0, "h", (Gpu(0, "GPU-x"),))), dcgm_compat=True)
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            name, kind = line.split()[2:4]
            exported.add(name)
            if kind == "counter":
                exported.add(name if name.endswith("_total") else name + "_total")
    dashboard = (DEPLOY / "grafana-dashboard.json").read_text()
    rules = (DEPLOY / "gpuwarden-alerts.yml").read_text()
    used = set(re.findall(r"\b(gpuwarden_[a-z_]+)", dashboard + rules))
    assert used and used <= exported, used - exported


def test_no_legend_names_a_label_that_is_empty_by_default():
    """`command` is empty unless exporter.show_commands: a legend naming it would end
    in a blank where the admin kept commands out."""
    dashboard = json.loads((DEPLOY / "grafana-dashboard.json").read_text())
    legends = [t.get("legendFormat", "") for p in dashboard["panels"] for t in p.get("targets", [])]
    assert any("{{user}}" in x for x in legends)
    assert not [x for x in legends if "{{command}}" in x]


@pytest.mark.slow
def test_prometheus_stores_the_simulated_values(sim, tmp_path):
    sim("server-8xa100")
    from gpuwarden.machine.inventory import read_snapshot

    truth = read_snapshot()
    with prometheus_scraping(tmp_path, {"box": {"GPUWARDEN_SIM": "server-8xa100"}}) as base:

        def complete() -> list[dict]:
            stored = query(base, "gpuwarden_gpu_memory_used_bytes")
            return stored if len(stored) == len(truth.gpus) else []

        stored = wait_for(complete, 25, "a complete scrape stored in Prometheus", 0.3)
        by_gpu = {int(r["metric"]["gpu"]): r for r in stored}
        for gpu in truth.gpus:
            sample = by_gpu[gpu.index]
            assert sample["metric"]["uuid"] == gpu.uuid
            assert sample["metric"]["model"] == gpu.name
            assert sample["metric"]["hostname"] == truth.hostname
            assert float(sample["value"][1]) == gpu.memory_used

        def values(promql: str) -> dict[int, float]:
            return {int(r["metric"]["gpu"]): float(r["value"][1]) for r in query(base, promql)}

        assert values("gpuwarden_gpu_memory_total_bytes") == {
            g.index: float(g.memory_total) for g in truth.gpus
        }
        assert values("gpuwarden_gpu_temperature_celsius") == {
            g.index: float(g.temperature) for g in truth.gpus
        }
        assert values("DCGM_FI_DEV_FB_USED") == {g.index: g.memory_used / 2**20 for g in truth.gpus}
        # there at 0 before any XID, so the GpuFatalXid alert's increase() sees the first
        assert values('gpuwarden_gpu_xid_events_total{fatal="true"}') == {
            g.index: 0.0 for g in truth.gpus
        }
        users = {
            r["metric"]["user"]: float(r["value"][1])
            for r in query(base, "gpuwarden_user_memory_used_bytes")
        }
        expected: dict[str, float] = {}
        for g in truth.gpus:
            for p in g.processes:
                if p.used_memory is not None:
                    key = p.user or "unknown"
                    expected[key] = expected.get(key, 0.0) + p.used_memory
        assert users == expected
        groups = get_json(f"{base}/api/v1/rules")["data"]["groups"]
        assert [g["name"] for g in groups] == ["gpuwarden"]
        assert all(r["health"] != "err" for g in groups for r in g["rules"])
