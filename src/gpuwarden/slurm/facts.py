"""What one node tells a Slurm configuration about itself: `gpuwarden slurm conf`'s
gres.conf lines and NodeName= values, as lines (the admin's copy-and-paste form) or as
one JSON document (`--json`, schemas/slurm.json) that `gpuwarden slurm cluster` collects
from every node over ssh.
"""

from __future__ import annotations

import os
import sys
from typing import Any, Optional

from gpuwarden.base.errors import UserError

SCHEMA = 1


def read(dev_dir: str = "/dev", gpu_type: Optional[str] = None) -> dict[str, Any]:
    """This machine's facts, read once (NVML or the simulator, /proc)."""
    from gpuwarden.machine.inventory import read_snapshot
    from gpuwarden.slurm import gres, miggres

    snapshot = read_snapshot(processes=False, topology=True)
    if not snapshot.gpus:
        raise UserError(f"no GPUs to describe: {snapshot.error or 'NVML found none'}")
    devices = gres.read_devices(snapshot)
    has_mig = any(g.mig_mode and g.mig_instances for g in snapshot.gpus)
    minors = miggres.read_minors() if has_mig else None
    lines = gres.gres_lines(
        snapshot, devices, dev_dir=dev_dir, gpu_type=gpu_type, mig_minors=minors
    )
    return {
        "schema": SCHEMA,
        "hostname": snapshot.hostname,
        "node": snapshot.hostname.split(".", 1)[0],
        "source": snapshot.source,
        "cpus": os.cpu_count() or 1,
        "memory_mib": gres.memory_mib(),
        "gres": miggres.counts(lines),
        "gres_lines": lines,
        "notes": gres.notes(devices),
        "mig": has_mig,
        "mig_minors": None if not has_mig else ("driver" if minors is not None else "rule"),
        "gpus": [{"index": g.index, "uuid": g.uuid, "name": g.name} for g in snapshot.gpus],
        "address": ssh_address(os.environ),
        "python": sys.executable,
    }


def ssh_address(environ: Any) -> Optional[str]:
    """The address this machine was reached on when run over ssh (SSH_CONNECTION's third
    word): the one the asking machine, the future controller, can reach it on."""
    words = environ.get("SSH_CONNECTION", "").split()
    return words[2] if len(words) == 4 else None


def text(facts: dict[str, Any], section: str = "all") -> str:
    """`slurm conf`'s lines: gres.conf with what NVML could not say, then NodeName=."""
    from gpuwarden.slurm import gres, miggres

    out = []
    where = "" if facts["source"] == "nvml" else f" ({facts['source']})"
    if section in ("all", "gres"):
        out.append(f"# gres.conf for {facts['hostname']}{where}, in NVML index order")
        out += [f"# {note}" for note in facts["notes"]]
        if facts["mig"]:
            how = (
                f"from {miggres.MIG_MINORS}"
                if facts["mig_minors"] == "driver"
                else f"by the driver's numbering rule ({miggres.MIG_MINORS} unreadable here)"
            )
            out.append(
                "# MIG devices: one MultipleFiles= line each (parent GPU and its two "
                f"nvidia-caps devices), typed MODEL_PROFILE; capability minors {how}"
            )
        out += facts["gres_lines"]
    if section == "all":
        out.append("# slurm.conf: this node's line (`slurmd -C` prints sockets, cores, threads)")
    if section in ("all", "node"):
        out.append(
            gres.node_line(
                facts["hostname"],
                len(facts["gres_lines"]),
                cpus=facts["cpus"],
                memory_mib=facts["memory_mib"],
                gres=facts["gres"],
            )
        )
    return "\n".join(out)
