"""Fault injection on the simulated server while processes run: each fault must
drain the GPU (or not, by policy), show in the metrics and reach the hook."""

from __future__ import annotations

import getpass
import json
import os
import shlex
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from gpuwarden.exporter.metrics import render
from gpuwarden.exporter.server import ViewCache
from gpuwarden.health import xidlog
from gpuwarden.health.drain import list_drains
from gpuwarden.health.watch import HealthWatch, WatchSettings
from gpuwarden.machine.inventory import read_snapshot
from gpuwarden.sim import Machine
from ports import free_port
from waiting import wait_for

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def machine(sim):
    sim("server-8xa100")
    m = Machine.open()
    m.add_process(7, os.getpid(), "20GiB", user="dave", command="python train.py")
    return m


@pytest.fixture
def watch(machine, tmp_path):
    out = tmp_path / "hook.jsonl"
    code = f"import sys; open({str(out)!r}, 'a').write(sys.stdin.read() + '\\n')"
    settings = WatchSettings(policy="drain", hook=(sys.executable, "-c", code), poll_seconds=0.2)
    w = HealthWatch(settings, log=lambda line: None)
    w.hook_file = out  # type: ignore[attr-defined]
    w.start()
    wait_for(lambda: w.listening, 10, "the XID listener")
    yield w
    w.stop()


def hook_events(w) -> list[dict]:
    try:
        return [json.loads(x) for x in w.hook_file.read_text().splitlines()]
    except FileNotFoundError:
        return []


def uuid_of(machine, index: int) -> str:
    return read_snapshot(processes=False).gpus[index].uuid


def metric_line(text: str, name: str, gpu: int, extra: str = "") -> str:
    for line in text.splitlines():
        if line.startswith(name + "{") and f'gpu="{gpu}"' in line and extra in line:
            return line
    return ""


@pytest.mark.parametrize(
    "fault, code",
    [
        (lambda m: m.inject_xid(7, 79), "xid-79"),
        (lambda m: m.inject_xid(7, 48), "xid-48"),
        (lambda m: m.set_ecc(7, uncorrected=2), "ecc-uncorrected"),
        (lambda m: m.lose(7), "lost"),
        (lambda m: m.set_remapped_rows(7, failure=True), "remap-failure"),
    ],
    ids=["xid79", "xid48", "ecc", "lost", "remap-failure"],
)
def test_fatal_fault_drains_shows_in_metrics_and_calls_hook(machine, watch, fault, code):
    uuid = uuid_of(machine, 7)
    fault(machine)
    wait_for(lambda: uuid in list_drains(), 10, f"GPU 7 drained after {code}")
    drain = list_drains()[uuid]
    assert drain.auto and drain.uid == os.getuid() and drain.who.endswith("(health watch)")
    wait_for(lambda: any(e["code"] == code for e in hook_events(watch)), 10, f"the hook's {code}")
    event = next(e for e in hook_events(watch) if e["code"] == code)
    assert event["gpu_index"] == 7 and event["level"] == "fatal" and event["drained"]
    text = render(ViewCache(cache_seconds=0).get())
    assert metric_line(text, "gpuwarden_gpu_health", 7, 'state="fatal"').endswith(" 1.0")
    assert metric_line(text, "gpuwarden_gpu_drained", 7).endswith(" 1.0")
    assert metric_line(text, "gpuwarden_gpu_health", 6, 'state="fatal"').endswith(" 0.0")
    # the process on the GPU is still reported while the GPU is readable
    if code != "lost":
        assert f'pid="{os.getpid()}"' in text
    assert list(list_drains()) == [uuid]  # only the faulty GPU


def test_xid_is_recorded_and_counted(machine, watch):
    uuid = uuid_of(machine, 3)
    machine.inject_xid(3, 13)  # an application fault: a warning, no drain
    wait_for(lambda: xidlog.xids_seen().get(uuid) == (13,), 10, "XID 13 recorded")
    wait_for(
        lambda: any(e["code"] == "xid-13" for e in hook_events(watch)), 10, "the hook's xid-13"
    )
    assert uuid not in list_drains()
    text = render(ViewCache(cache_seconds=0).get())
    assert metric_line(text, "gpuwarden_gpu_xid_errors_total", 3, 'xid="13"').endswith(" 1.0")
    assert metric_line(text, "gpuwarden_gpu_health", 3, 'state="warning"').endswith(" 1.0")


def test_alert_policy_only_notifies(machine):
    seen = []
    w = HealthWatch(
        WatchSettings(policy="alert", poll_seconds=0.2),
        log=lambda line: None,
        on_finding=lambda g, f, e: seen.append(e),
    )
    w.start()
    try:
        wait_for(lambda: w.listening, 10, "the XID listener")
        machine.inject_xid(2, 79)
        wait_for(lambda: any(e["code"] == "xid-79" for e in seen), 10, "the xid-79 notice")
        assert list_drains() == {}
    finally:
        w.stop()


def _append_hook(out: Path) -> str:
    code = f"import sys; open({str(out)!r}, 'a').write(sys.stdin.read())"
    return f"{sys.executable} -c {shlex.quote(code)}"


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT / "src")
    return env


@pytest.mark.slow
def test_exporter_end_to_end_xid79(machine, isolated, tmp_path, cli):
    """The issue's acceptance path: XID 79 on a running server drains the GPU and shows
    in /metrics and `health` (and `run --dry-run` counts 7 healthy GPUs)."""
    hook_out = tmp_path / "hook.out"
    cfg = isolated / "etc" / "config.toml"
    cfg.parent.mkdir(parents=True, exist_ok=True)
    cfg.write_text(
        "[health]\npoll_seconds = 0.3\n"
        f"hook = {json.dumps(_append_hook(hook_out))}\n"
        'webhook = "http://127.0.0.1:9/never"\nwebhook_timeout = 0.5\n'
        "[exporter]\ncache_seconds = 0\n"
    )
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "gpuwarden", "exporter", "--listen", f"127.0.0.1:{port}"],
        env=_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    url = f"http://127.0.0.1:{port}/metrics"

    def scrape() -> str:
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                return r.read().decode()
        except OSError:
            return ""

    try:
        wait_for(scrape, 15, "the exporter serving")
        time.sleep(1.0)  # the XID listener registers right after start
        machine.inject_xid(5, 79)
        wait_for(
            lambda: metric_line(scrape(), "gpuwarden_gpu_drained", 5).endswith(" 1.0"),
            15,
            "GPU 5 drained in the metrics",
        )
        text = scrape()
        # root's watch drains under its own name, as docs/monitoring.md says
        by = 'by="gpuwarden-health"' if os.getuid() == 0 else f'by="{getpass.getuser()}"'
        assert metric_line(text, "gpuwarden_gpu_drained", 5, by).endswith(" 1.0"), text
        assert metric_line(text, "gpuwarden_gpu_health", 5, 'state="fatal"').endswith(" 1.0")
        assert metric_line(text, "gpuwarden_gpu_xid_errors_total", 5, 'xid="79"').endswith(" 1.0")
        wait_for(
            lambda: hook_out.exists() and "xid-79" in hook_out.read_text(), 10, "the hook's xid-79"
        )
        # the unreachable webhook did not stop scraping
        started = time.monotonic()
        assert scrape() and time.monotonic() - started < 1.5
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=10)
    assert "Traceback" not in err, err
    done = cli("health")
    assert done.returncode == 3
    assert "XID 79 (GPU has fallen off the bus)" in done.stdout
    as_json = json.loads(cli("health", "--json").stdout)
    gpu5 = as_json["gpus"][5]
    assert gpu5["state"] == "fatal" and gpu5["drained"].startswith("XID 79")
    assert [g["state"] for g in as_json["gpus"]].count("fatal") == 1
    status = cli("status", "--json")
    assert status.returncode == 0, status.stderr
    assert "XID 79 (GPU has fallen off the bus)" in status.stdout
    if (ROOT / "src" / "gpuwarden" / "cli" / "run.py").exists():
        dry = cli("run", "-g", "8", "--dry-run", "--", "true")
        assert dry.returncode != 0
        assert "7" in (dry.stdout + dry.stderr)


def test_a_fatal_fault_drains_the_slurm_node_when_configured(machine, monkeypatch):
    """`slurm.drain_node`: after draining the GPU, the watch drains the Slurm node too
    (the real `scontrol` path is tested against a real Slurm in test_slurm_real)."""
    from gpuwarden.slurm import tools

    calls = []
    monkeypatch.setattr(tools, "drain_node", lambda node, reason: calls.append((node, reason)))
    w = HealthWatch(WatchSettings(policy="drain", slurm_node="node7"), log=lambda line: None)
    machine.set_ecc(7, uncorrected=2)  # seen by polling: no event loop needed here
    w.check(w._snapshot())
    assert calls and calls[0][0] == "node7" and "GPU 7" in calls[0][1]
    assert uuid_of(machine, 7) in list_drains()
    plain = HealthWatch(WatchSettings(policy="drain"), log=lambda line: None)
    machine.set_ecc(6, uncorrected=2)
    plain.check(plain._snapshot())
    assert len(calls) == 1  # not configured: the node is left alone
