"""Every query of gpuwarden's Grafana dashboard and of NVIDIA's dcgm-exporter dashboard
returns data, evaluated by Debian's Prometheus as Grafana would ask it.

The machine is the simulated `mixed` one (T4, V100 with ECC errors, RTX A6000, an
A100 split into MIG instances) with an H200 added for what only Hopper gives through
NVML (the profiling counters, by GPM), with leases (a whole GPU and a MIG slice),
processes, XIDs (one fatal, one not) and a drain by hand beside the health watch's.
The exporter runs as `gpuwarden exporter --dcgm-compat` under a scrape job not
named `gpuwarden`. Each query goes through Prometheus's HTTP API as Grafana sends it:
template variables from `label_values()`, "All" selected and substituted as
Grafana's Prometheus data source does, range queries over the dashboard's time
range (instant ones where the panel asks for that), annotations at their step.
"""

from __future__ import annotations

import json
import re
import time
import urllib.parse
from pathlib import Path
from typing import Any

import pytest

import waiting
from scraping import (
    DEFAULT_COUNTERS,
    DEPLOY,
    LABELS,
    NOT_EXPORTED,
    get_json,
    prometheus_scraping,
    query,
)
from shells import exports

SPECS = Path(__file__).resolve().parent.parent / "src" / "gpuwarden" / "sim" / "specs"

# NVIDIA's dcgm-exporter dashboard ("NVIDIA DCGM Exporter Dashboard", Grafana 12239;
# grafana/dcgm-exporter-dashboard.json in NVIDIA/dcgm-exporter): its template variables
# (both multi-value with "All", no custom all value) and every panel's target, as
# written there: (panel, expr, instant).
NVIDIA_VARIABLES = {
    "instance": "label_values(DCGM_FI_DEV_GPU_TEMP, instance)",
    "gpu": "label_values(DCGM_FI_DEV_GPU_TEMP, gpu)",
}
NVIDIA_TARGETS = (
    ("GPU Temperature", 'DCGM_FI_DEV_GPU_TEMP{instance=~"$instance", gpu=~"$gpu"}', False),
    ("GPU Avg. Temp", 'avg(DCGM_FI_DEV_GPU_TEMP{instance=~"$instance", gpu=~"$gpu"})', False),
    ("GPU Power Usage", 'DCGM_FI_DEV_POWER_USAGE{instance=~"$instance", gpu=~"$gpu"}', False),
    ("GPU Power Total", 'sum(DCGM_FI_DEV_POWER_USAGE{instance=~"$instance", gpu=~"$gpu"})', True),
    (
        "GPU SM Clocks",
        'DCGM_FI_DEV_SM_CLOCK{instance=~"$instance", gpu=~"$gpu"} * 1000000',
        False,
    ),
    ("GPU Utilization", 'DCGM_FI_DEV_GPU_UTIL{instance=~"$instance", gpu=~"$gpu"}', False),
    (
        "GPU Framebuffer Mem Used",
        'DCGM_FI_DEV_FB_USED{instance=~"$instance", gpu=~"$gpu"}',
        False,
    ),
    (
        "Tensor Core Utilization",
        'DCGM_FI_PROF_PIPE_TENSOR_ACTIVE{instance=~"$instance", gpu=~"$gpu"}',
        False,
    ),
)

H200 = """
[[gpu]]
model = "H200-SXM-141GB"
pci_bus_id = "00000000:D8:00.0"
numa_node = 1
temperature = 33
power = 120.0
"""

RANGE = 300.0  # the dashboard's time range: the last 5 minutes
STEP = 15.0  # Grafana's step for it: the data source's default minimum interval


def regex_escape(value: str) -> str:
    """Grafana's prometheusSpecialRegexEscape: a value put into a regex matcher's
    string, so `.` in an address matches a dot (backslashes doubled for PromQL)."""
    value = value.replace("\\", "\\\\\\\\")
    return re.sub(r"[$^*{}\[\]'+?.()|]", lambda m: "\\\\" + m.group(0), value)


def all_selected(values: list[str], all_value: Any) -> str:
    """What Grafana substitutes for a multi-value variable with "All" selected."""
    if all_value:
        return str(all_value)
    escaped = [regex_escape(v) for v in values]
    return escaped[0] if len(escaped) == 1 else "(" + "|".join(escaped) + ")"


def substitute(expr: str, variables: dict[str, str]) -> str:
    for name, value in variables.items():
        expr = expr.replace("${" + name + "}", value).replace("[[" + name + "]]", value)
        expr = re.sub(rf"\${name}\b", lambda _, value=value: value, expr)
    assert "$" not in expr, f"a variable Grafana would fill is left in {expr!r}"
    return expr


def label_values(base: str, definition: str, now: float) -> list[str]:
    """A `label_values(metric, label)` variable, as Grafana asks Prometheus for it."""
    found = re.fullmatch(r"label_values\((\w+),\s*(\w+)\)", definition.strip())
    assert found, definition
    metric, label = found.groups()
    params = {"match[]": metric, "start": now - RANGE, "end": now}
    url = f"{base}/api/v1/label/{label}/values?" + urllib.parse.urlencode(params)
    return sorted(get_json(url)["data"])


def range_query(base: str, expr: str, now: float, step: float = STEP) -> list[dict]:
    params = {"query": expr, "start": now - RANGE, "end": now, "step": step}
    answer = get_json(f"{base}/api/v1/query_range?" + urllib.parse.urlencode(params))
    assert answer["status"] == "success", (expr, answer)
    return [r for r in answer["data"]["result"] if r["values"]]


def instant_query(base: str, expr: str, now: float) -> list[dict]:
    params = {"query": expr, "time": now}
    answer = get_json(f"{base}/api/v1/query?" + urllib.parse.urlencode(params))
    assert answer["status"] == "success", (expr, answer)
    return answer["data"]["result"]


def grafana_targets(dashboard: dict) -> list[tuple[str, str, bool, bool]]:
    """(panel title, expr, instant, range) of every target, rows' panels included."""
    found = []
    panels = list(dashboard["panels"])
    while panels:
        panel = panels.pop(0)
        panels += panel.get("panels", [])
        for target in panel.get("targets", []):
            instant = bool(target.get("instant"))
            ranged = bool(target.get("range", not instant))
            found.append((panel["title"], target["expr"], instant, ranged))
    return found


def wait_for(base: str, what: dict[str, int], timeout: float = 40) -> None:
    """Until each query returns at least so many series (the watch has seen the XIDs
    and drained, the GPM counters have their second sample, ...)."""
    short: dict[str, int] = {}

    def enough() -> bool:
        short.clear()
        short.update({e: n for e, n in what.items() if len(query(base, e)) < n})
        return not short

    waiting.wait_for(enough, timeout, lambda: f"too few series in {short}", 0.3)


@pytest.mark.slow
def test_every_dashboard_query_returns_data(sim, cli, tmp_path):
    spec = tmp_path / "mixed-and-h200.toml"
    spec.write_text((SPECS / "mixed.toml").read_text() + H200)
    sim(str(spec))
    with prometheus_scraping(tmp_path, {"vm": {}}, job="lab-gpus") as base:
        held = []
        for args in (("--gpus", "0"), ("-g", "1", "--model", "A100")):
            r = cli("reserve", *args, "--for", "10m")
            assert r.returncode == 0, r.stderr
            held.append(exports(r.stdout)["GPUWARDEN_RESERVATION"])
        try:
            for gpu, xid in (("0", "13"), ("2", "48")):
                r = cli("sim", "inject", "xid", "--gpu", gpu, xid)
                assert r.returncode == 0, r.stderr
            r = cli("drain", "4", "--reason", "fan replacement")
            assert r.returncode == 0, r.stderr
            wait_for(
                base,
                {
                    "gpuwarden_gpu_leased == 1": 2,
                    "gpuwarden_gpu_xid_errors_total": 2,
                    "gpuwarden_gpu_drained == 1": 3,  # the V100 and A6000 by the watch, GPU 4
                    "gpuwarden_gpu_health_finding": 1,
                    "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": 1,  # GPM's second sample taken
                    'ALERTS{alertname="GpuFatalXid"}': 1,
                },
            )
            now = time.time()
            empty = []

            # gpuwarden's own dashboard, its variables, panels and annotations
            dashboard = json.loads((DEPLOY / "grafana-dashboard.json").read_text())
            variables = {}
            for var in dashboard["templating"]["list"]:
                if var["type"] != "query":
                    continue
                definition = var.get("definition") or var["query"]["query"]
                values = label_values(base, definition, now)
                assert values, f"variable {var['name']}: {definition} lists nothing"
                variables[var["name"]] = all_selected(values, var.get("allValue"))
            variables["datasource"] = "Prometheus"
            for title, expr, instant, ranged in grafana_targets(dashboard):
                promql = substitute(expr, variables)
                if instant and not instant_query(base, promql, now):
                    empty.append(f"gpuwarden: {title}: {promql} (instant)")
                if ranged and not range_query(base, promql, now):
                    empty.append(f"gpuwarden: {title}: {promql}")
            for note in dashboard["annotations"]["list"]:
                if "expr" not in note:
                    continue
                step = float(note.get("step", "60s").rstrip("s"))
                promql = substitute(note["expr"], variables)
                if not range_query(base, promql, now, step):
                    empty.append(f"gpuwarden: annotation {note['name']}: {promql}")

            # NVIDIA's dashboard
            variables = {}
            for name, definition in NVIDIA_VARIABLES.items():
                values = label_values(base, definition, now)
                assert values, f"NVIDIA's variable {name}: {definition} lists nothing"
                variables[name] = all_selected(values, None)
            assert "\\\\." in variables["instance"]  # the address's dots, escaped as Grafana does
            for title, expr, instant in NVIDIA_TARGETS:
                promql = substitute(expr, variables)
                found = (
                    instant_query(base, promql, now) if instant else range_query(base, promql, now)
                )
                if not found:
                    empty.append(f"NVIDIA: {title}: {promql}")
            assert not empty, "queries that return no data:\n" + "\n".join(empty)

            # every default counter of dcgm-exporter that NVML gives, with its labels,
            # stored by Prometheus; the A100's memory per MIG instance
            stored = instant_query(base, '{__name__=~"DCGM_FI_.+"}', now)
            assert {r["metric"]["__name__"] for r in stored} >= set(DEFAULT_COUNTERS) - NOT_EXPORTED
            assert all(set(r["metric"]) >= LABELS for r in stored)
            a100 = instant_query(base, 'DCGM_FI_DEV_FB_USED{modelName=~".*A100.*"}', now)
            profiles = sorted(r["metric"].get("GPU_I_PROFILE", "") for r in a100)
            assert profiles == ["1g.10gb", "1g.10gb", "2g.20gb", "3g.40gb"]

            # the two panels that were empty say what they should: health per GPU
            # (T4 warning from XID 13; V100 and A6000 fatal; A100 ok), and the
            # drains as annotations, the one by hand with its reason
            health = substitute(
                grafana_expr(dashboard, "Health"), {"hostname": ".*", "datasource": ""}
            )
            states = {r["metric"]["gpu"]: r["value"][1] for r in instant_query(base, health, now)}
            assert states == {"0": "1", "1": "2", "2": "2", "3": "0", "4": "0"}
            drains = substitute(
                dashboard["annotations"]["list"][0]["expr"], {"hostname": ".*", "datasource": ""}
            )
            reasons = {
                r["metric"]["gpu"]: r["metric"]["reason"]
                for r in range_query(base, drains, now, 60)
            }
            assert set(reasons) == {"1", "2", "4"} and reasons["4"] == "fan replacement"
        finally:
            for rid in held:
                cli("release", env={"GPUWARDEN_RESERVATION": rid})


def grafana_expr(dashboard: dict, title: str) -> str:
    [expr] = [e for t, e, _, _ in grafana_targets(dashboard) if t == title]
    return expr
