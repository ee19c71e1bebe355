"""`gpuwarden visible`: which GPUs this shell's CUDA_VISIBLE_DEVICES exposes, as what cuda:N.

It reports what CUDA will do with the environment, malformed values included
(those are what it is for), so a value CUDA reads only in part is shown with
the devices that survive and where reading stopped, and still exits 0.
`--check` turns problems into exit status 1, for job prologues and scripts.
"""

from __future__ import annotations

import json
import os
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import argparse

    from gpuwarden.cli import Commands
    from gpuwarden.machine.inventory import Snapshot
    from gpuwarden.placement.visible import Resolution

SCHEMA = "gpuwarden.placement.visible/1"


def register(commands: Commands, name: str) -> None:
    from gpuwarden.cli import subcommand

    parser = subcommand(commands, name)
    parser.add_argument("--json", action="store_true", help="print the mapping as JSON")
    parser.add_argument(
        "--check",
        action="store_true",
        help="exit 1 when CUDA_VISIBLE_DEVICES is malformed (CUDA ignores part of it)",
    )


def run(args: argparse.Namespace) -> int:
    from gpuwarden.machine.inventory import read_snapshot
    from gpuwarden.placement.visible import resolve

    snapshot = read_snapshot(processes=False)
    resolution = resolve(snapshot, os.environ)
    if args.json:
        print(json.dumps(as_json(snapshot, resolution), indent=2))
    else:
        print_table(snapshot, resolution)
    return 1 if args.check and resolution.problems else 0


def as_json(snapshot: Snapshot, resolution: Resolution) -> dict:
    return {
        "schema": SCHEMA,
        "source": snapshot.source,
        "error": snapshot.error,
        "cuda_visible_devices": resolution.value,
        "cuda_device_order": os.environ.get("CUDA_DEVICE_ORDER"),
        "effective_device_order": resolution.device_order,
        "devices": [
            {
                "cuda_index": d.cuda_index,
                "index": d.index,
                "uuid": d.uuid,
                "name": d.name,
                "mig_uuid": d.mig_uuid,
            }
            for d in resolution.devices
        ],
        "stopped_at": resolution.stopped_at,
        "problems": list(resolution.problems),
        "warnings": list(resolution.warnings),
    }


def print_table(snapshot: Snapshot, resolution: Resolution) -> None:
    out = sys.stdout
    if snapshot.error and not snapshot.gpus:
        suffix = "" if "CPU only" in snapshot.error else "; CPU only"
        print(f"{snapshot.error}{suffix}", file=out)
        return
    value = "unset (every GPU)" if resolution.value is None else repr(resolution.value)
    order = os.environ.get("CUDA_DEVICE_ORDER")
    order_text = resolution.device_order + ("" if order else " (default)")
    print(f"CUDA_VISIBLE_DEVICES: {value}   CUDA_DEVICE_ORDER: {order_text}", file=out)
    if not resolution.devices:
        print("no GPU is visible to CUDA", file=out)
    else:
        rows = [("CUDA", "GPU", "UUID", "NAME")]
        rows += [
            (
                f"cuda:{d.cuda_index}",
                str(d.index),
                d.mig_uuid or d.uuid,
                d.name or "n/a",
            )
            for d in resolution.devices
        ]
        widths = [max(len(row[i]) for row in rows) for i in range(3)]
        for row in rows:
            print(
                f"{row[0]:<{widths[0]}}  {row[1]:>{widths[1]}}  {row[2]:<{widths[2]}}  {row[3]}",
                file=out,
            )
    for problem in resolution.problems:
        print(f"problem: {problem}", file=out)
    for warning in resolution.warnings:
        print(f"warning: {warning}", file=out)
