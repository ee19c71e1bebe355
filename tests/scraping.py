"""What the metrics tests share: reading Prometheus' text format, the names
dcgm-exporter uses, and Debian's Prometheus scraping gpuwarden's exporters."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from components import require
from ports import free_port
from waiting import wait_for

ROOT = Path(__file__).resolve().parent.parent
DEPLOY = ROOT / "deploy"


def component(name: str) -> str:
    path = shutil.which(name) or (f"/usr/bin/{name}" if Path(f"/usr/bin/{name}").exists() else None)
    require(path is not None, f"{name} is not installed (Debian package `prometheus`)")
    assert path is not None
    return path


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


def samples(text: str) -> dict:
    """{(name, frozenset(labels)): value}, each under the name Prometheus stores it by:
    the name written (prometheus-client's parser adds `_total` to a counter's samples,
    where dcgm-exporter's counters have none)."""
    written = {line.split("{")[0].split()[0] for line in text.splitlines() if line[:1].isalpha()}
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            name = s.name
            if name not in written and name.endswith("_total") and name[:-6] in written:
                name = name[:-6]
            out[(name, frozenset(s.labels.items()))] = s.value
    return out


def value(found: dict, name: str, **labels) -> float:
    hits = [v for (n, lab), v in found.items() if n == name and set(labels.items()) <= lab]
    assert len(hits) == 1, (name, labels, hits)
    return hits[0]


# dcgm-exporter's etc/default-counters.csv (NVIDIA/dcgm-exporter): the counters it
# exports by default, as data.
DEFAULT_COUNTERS = (
    *("DCGM_FI_DEV_SM_CLOCK", "DCGM_FI_DEV_MEM_CLOCK", "DCGM_FI_DEV_MEMORY_TEMP"),
    *("DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_DEV_POWER_USAGE", "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"),
    *("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", "DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_MEM_COPY_UTIL"),
    *("DCGM_FI_DEV_ENC_UTIL", "DCGM_FI_DEV_DEC_UTIL", "DCGM_FI_DEV_XID_ERRORS"),
    *("DCGM_FI_DEV_FB_FREE", "DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_FB_RESERVED"),
    *("DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL", "DCGM_FI_DEV_VGPU_LICENSE_STATUS"),
    *("DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS"),
    *("DCGM_FI_DEV_ROW_REMAP_FAILURE", "DCGM_FI_PROF_GR_ENGINE_ACTIVE"),
    *("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "DCGM_FI_PROF_DRAM_ACTIVE"),
    *("DCGM_FI_PROF_PCIE_TX_BYTES", "DCGM_FI_PROF_PCIE_RX_BYTES"),
)
# Not exported, and why (docs/monitoring.md): NVML has no figure in DCGM's unit for
# the first, and the second is a vGPU guest's licence, which a bare-metal host has not.
NOT_EXPORTED = {"DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL", "DCGM_FI_DEV_VGPU_LICENSE_STATUS"}
LABELS = {"gpu", "UUID", "pci_bus_id", "device", "modelName", "hostname"}


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

        def scraped() -> bool:
            for proc in procs:
                assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
            return len(query(base, "up == 1")) >= len(exporters)

        wait_for(scraped, 25, "Prometheus scraping every exporter", 0.3)
        yield base
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
