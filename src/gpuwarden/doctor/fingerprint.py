"""`gpuwarden doctor --export FILE`: the environment as a reproducible record.

What the seeds advise with `conda env export`, plus what conda does not know:
the driver, the GPUs (by UUID), torch's CUDA/cuDNN/NCCL, and the variables
that change how CUDA and torch behave. Text for people, JSON (by the `.json`
extension) for diffing two machines. Variable values whose names look secret
are left out.
"""

from __future__ import annotations

import glob
import json
import os
import platform
import sys
import time
from collections.abc import Mapping
from typing import Any

from gpuwarden.doctor.facts import Facts
from gpuwarden.machine.inventory import dotted

ENV_PREFIXES = (
    "CUDA_",
    "NCCL_",
    "TORCH_",
    "PYTORCH_",
    "GPUWARDEN_",
    "NVIDIA_",
    "CUBLAS_",
    "CUDNN_",
)
ENV_NAMES = (
    "MASTER_ADDR",
    "MASTER_PORT",
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "OMP_NUM_THREADS",
    "LD_LIBRARY_PATH",
    "CONDA_PREFIX",
    "CONDA_DEFAULT_ENV",
    "VIRTUAL_ENV",
    "PYTHONPATH",
)
SECRET_WORDS = ("TOKEN", "SECRET", "PASSWORD", "PASSWD", "KEY", "CREDENTIAL")


def relevant_environ(environ: Mapping[str, str]) -> dict[str, str]:
    out = {}
    for name in sorted(environ):
        if not (name.startswith(ENV_PREFIXES) or name in ENV_NAMES):
            continue
        if any(word in name.upper() for word in SECRET_WORDS):
            out[name] = "<hidden>"
        else:
            out[name] = environ[name]
    return out


def pip_freeze() -> list[str]:
    """`pip freeze`'s lines from installed distributions' metadata (no pip subprocess)."""
    from importlib import metadata

    seen: dict[str, str] = {}
    for dist in metadata.distributions():
        name = dist.metadata.get("Name")
        if not name or name.lower() in seen:
            continue
        seen[name.lower()] = f"{name}=={dist.version}"
    return [seen[k] for k in sorted(seen)]


def conda_export(prefix: str) -> list[str]:
    """`conda list --export`'s lines (name=version=build), read from conda-meta directly."""
    lines = []
    for path in glob.glob(os.path.join(prefix, "conda-meta", "*.json")):
        try:
            with open(path, encoding="utf-8") as fh:
                rec = json.load(fh)
        except (OSError, ValueError):
            continue
        if {"name", "version", "build"} <= rec.keys():
            lines.append(f"{rec['name']}={rec['version']}={rec['build']}")
    return sorted(lines)


def conda_prefix(environ: Mapping[str, str]) -> str | None:
    for candidate in (sys.prefix, environ.get("CONDA_PREFIX")):
        if candidate and os.path.isdir(os.path.join(candidate, "conda-meta")):
            return candidate
    return None


def collect(facts: Facts) -> dict[str, Any]:
    snap, t = facts.snapshot, facts.torch
    prefix = conda_prefix(facts.environ)
    return {
        "taken_at": time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime()),
        "host": snap.hostname,
        "os": {
            "platform": platform.platform(),
            "system": platform.system(),
            "release": platform.release(),
            "machine": platform.machine(),
        },
        "python": {
            "version": platform.python_version(),
            "implementation": platform.python_implementation(),
            "executable": sys.executable,
            "prefix": sys.prefix,
        },
        "torch": {
            "version": t.version,
            "cuda": t.cuda,
            "hip": t.hip,
            "cudnn": t.cudnn,
            "nccl": t.nccl_version,
            "arch_list": list(t.arch_list) if t.arch_list is not None else None,
            "location": t.location,
        }
        if t.installed
        else None,
        "driver": {
            "version": snap.driver_version,
            "cuda": dotted(snap.cuda_driver_version),
            "nvml": snap.nvml_version,
            "source": snap.source,
            "error": snap.error,
        },
        "gpus": [
            {
                "index": g.index,
                "uuid": g.uuid,
                "name": g.name,
                "pci_bus_id": g.pci_bus_id,
                "compute_capability": dotted(g.compute_capability),
                "memory_total": g.memory_total,
                "mig_mode": g.mig_mode,
            }
            for g in snap.gpus
        ],
        "environment": relevant_environ(facts.environ),
        "pip_freeze": pip_freeze(),
        "conda": {"prefix": prefix, "export": conda_export(prefix)} if prefix else None,
    }


def render_text(data: Mapping[str, Any]) -> str:
    lines = [f"# gpuwarden environment fingerprint, {data['host']}, {data['taken_at']}", ""]
    for section in ("os", "python", "torch", "driver"):
        lines.append(f"[{section}]")
        value = data.get(section)
        if value is None:
            lines.append("not installed")
        else:
            for k, v in value.items():
                shown = " ".join(v) if isinstance(v, list) else ("n/a" if v is None else v)
                lines.append(f"{k} = {shown}")
        lines.append("")
    lines.append("[gpus]")
    for g in data["gpus"] or []:
        lines.append(
            f"{g['index']}  {g['uuid']}  {g['name'] or 'n/a'}  "
            f"cc {g['compute_capability'] or 'n/a'}  {g['pci_bus_id'] or 'n/a'}"
        )
    if not data["gpus"]:
        lines.append("none")
    lines += ["", "[environment]"]
    lines += [f"{k}={v}" for k, v in data["environment"].items()] or ["none relevant set"]
    lines += ["", "[pip freeze]", *data["pip_freeze"]]
    if data.get("conda"):
        lines += ["", f"[conda list --export] {data['conda']['prefix']}", *data["conda"]["export"]]
    return "\n".join(lines) + "\n"


def export(facts: Facts, path: str) -> str:
    """Write the fingerprint; JSON when `path` ends in .json, text otherwise. Returns the format."""
    data = collect(facts)
    as_json = path.lower().endswith(".json")
    body = json.dumps(data, indent=2) + "\n" if as_json else render_text(data)
    if path == "-":
        sys.stdout.write(body)
    else:
        with open(path, "w", encoding="utf-8") as fh:
            fh.write(body)
    return "json" if as_json else "text"
