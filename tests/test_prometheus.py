"""Real components: Debian's Prometheus scrapes the exporter on the simulated server,
and promtool accepts the shipped alert rules.

Skipped with the reason when prometheus/promtool are absent, unless
GPUWARDEN_REQUIRE_COMPONENTS=1 (CI), where a missing component is a failure.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from conftest import require

ROOT = Path(__file__).resolve().parent.parent
DEPLOY = ROOT / "deploy"


def component(name: str) -> str:
    path = shutil.which(name) or (f"/usr/bin/{name}" if Path(f"/usr/bin/{name}").exists() else None)
    require(path is not None, f"{name} is not installed (Debian package `prometheus`)")
    assert path is not None
    return path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def get_json(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=3) as reply:
        return json.loads(reply.read())


def query(base: str, promql: str) -> list[dict]:
    url = f"{base}/api/v1/query?" + urllib.parse.urlencode({"query": promql})
    try:
        answer = get_json(url)
    except OSError:
        return []
    return answer.get("data", {}).get("result", []) if answer.get("status") == "success" else []


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

    from gpuwarden.exporter import View, render
    from gpuwarden.inventory import Gpu, Snapshot

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


@contextlib.contextmanager
def prometheus_scraping(
    tmp_path: Path, exporters: dict[str, dict[str, str]], job: str = "gpuwarden"
) -> Iterator[str]:
    """Debian's Prometheus scraping one `gpuwarden exporter --dcgm-compat` per entry of
    `exporters` (name -> extra environment: which simulated machine, its state) every
    second, with the shipped alert rules; yields its base URL."""
    prometheus = component("prometheus")
    ports = {name: free_port() for name in exporters}
    prom_port = free_port()
    targets = ", ".join(f"'127.0.0.1:{port}'" for port in ports.values())
    config = tmp_path / "prometheus.yml"
    config.write_text(
        "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
        f"rule_files:\n  - {DEPLOY / 'gpuwarden-alerts.yml'}\n"
        f"scrape_configs:\n  - job_name: {job}\n    static_configs:\n"
        f"      - targets: [{targets}]\n"
    )
    procs = []
    try:
        for name, extra in exporters.items():
            env = dict(os.environ, PYTHONPATH=str(ROOT / "src"), **extra)
            procs.append(subprocess.Popen(
                [sys.executable, "-m", "gpuwarden", "exporter", "--dcgm-compat",
                 "--listen", f"127.0.0.1:{ports[name]}"],
                env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
            ))  # fmt: skip
        procs.append(subprocess.Popen(
            [prometheus, f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'data'}",
             f"--web.listen-address=127.0.0.1:{prom_port}", "--log.level=warn"],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        ))  # fmt: skip
        base = f"http://127.0.0.1:{prom_port}"
        deadline = time.monotonic() + 25
        while len(query(base, "up == 1")) < len(exporters):
            for proc in procs:
                assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
            assert time.monotonic() < deadline, "Prometheus scraped no exporter in 25 s"
            time.sleep(0.3)
        yield base
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()


@pytest.mark.slow
def test_prometheus_stores_the_simulated_values(sim, tmp_path):
    sim("server-8xa100")
    from gpuwarden.inventory import read_snapshot

    truth = read_snapshot()
    with prometheus_scraping(tmp_path, {"box": {"GPUWARDEN_SIM": "server-8xa100"}}) as base:
        deadline = time.monotonic() + 25
        stored: list[dict] = []
        while time.monotonic() < deadline:
            stored = query(base, "gpuwarden_gpu_memory_used_bytes")
            if len(stored) == len(truth.gpus):
                break
            time.sleep(0.3)
        assert len(stored) == len(truth.gpus), "Prometheus stored no complete scrape in 25 s"
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
