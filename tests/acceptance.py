"""scripts/gpu-acceptance run where there is no GPU: the script run as its users run it,
and a stand-in nvidia-smi that answers from gpuwarden's simulator."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "gpu-acceptance"


def run_script(*args: str, path: str, env: dict[str, str] | None = None, out: Path):
    full = dict(os.environ, PATH=path, OUT=str(out), PYTHONPATH=str(ROOT / "src"))
    full.update(env or {})
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args],
        env=full,
        capture_output=True,
        text=True,
        timeout=600,
    )


FAKE_SMI = '''#!{python}
"""nvidia-smi's answers to the acceptance script's queries, from gpuwarden's simulator."""
import sys
from gpuwarden.machine.inventory import read_snapshot

snap = read_snapshot()
MIB = 2**20
def mib(v): return "[N/A]" if v is None else str(int(v // MIB))
def na(v): return "[N/A]" if v is None else str(v)
args = sys.argv[1:]
if not args:
    print(f"| NVIDIA-SMI {{snap.driver_version}}  CUDA Version: 12.4 |")
    sys.exit(0)
query = next(a.split("=", 1)[1] for a in args if a.startswith("--query"))
for g in snap.gpus:
    if any(a.startswith("--query-gpu") for a in args):
        vals = {{"index": g.index, "uuid": g.uuid, "name": g.name,
                "memory.total": mib(g.memory_total), "memory.used": mib(g.memory_used),
                "driver_version": snap.driver_version, "pci.bus_id": g.pci_bus_id,
                "utilization.gpu": na(g.utilization_gpu), "temperature.gpu": na(g.temperature),
                "power.draw": na(g.power_draw)}}
        print(", ".join(str(vals[f]) for f in query.split(",")))
    else:
        for p in g.processes:
            vals = {{"pid": p.pid, "gpu_uuid": g.uuid, "used_memory": mib(p.used_memory)}}
            print(", ".join(str(vals[f]) for f in query.split(",")))
'''
