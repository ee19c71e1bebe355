"""Draining this machine's Slurm node when a GPU fails fatally (`slurm.drain_node`).

The health watch (gpuwarden.health.watch) calls `drain_for_fault` on each new
fatal finding. Draining lets running jobs finish and starts no new one, the
same promise a local `gpuwarden drain` makes for one GPU; an admin resumes the
node with `scontrol update NodeName=... State=RESUME`.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any, Optional


def node_name(conf: Any) -> str:
    """`slurm.node`, else the short hostname (what slurmd registers by default)."""
    return conf.get("slurm.node") or os.uname().nodename.split(".", 1)[0]


def drain_for_fault(
    conf: Any,
    gpu: str,
    reason: str,
    *,
    drain: Optional[Callable[[str, str], None]] = None,
) -> Optional[str]:
    """Drain the node when configured; the node drained, or None when not configured.
    Slurm's refusal (controller down, unknown node) is a UserError with its text."""
    if not conf.get("slurm.drain_node"):
        return None
    if drain is None:
        from gpuwarden.slurm.tools import drain_node

        drain = drain_node
    node = node_name(conf)
    drain(node, f"gpuwarden: GPU {gpu}: {reason}")
    return node
