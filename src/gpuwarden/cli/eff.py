"""`gpuwarden eff ID...`: how well a job used its GPUs (as seff and jobstats): GPU-hours
held, mean utilisation and memory peak per GPU, energy, and what to look at."""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    import argparse
    from collections.abc import Mapping
    from typing import Any

    from gpuwarden.cli import Commands


def register(commands: Commands, name: str) -> None:
    from gpuwarden.cli import subcommand

    parser = subcommand(commands, name)
    parser.add_argument("ids", nargs="+", metavar="ID", help="job ids (12 13, or 12,13)")
    parser.add_argument("--json", action="store_true", help="print JSON")


def run(args: argparse.Namespace) -> int:
    import json

    from gpuwarden.cli import service_client
    from gpuwarden.cli.jobtables import job_ids

    ids = job_ids(args.ids)
    with service_client() as client:
        jobs = client.call("eff", jobs=ids)["jobs"]
    if args.json:
        print(json.dumps(jobs, indent=2))
        return 0
    print("\n\n".join(describe(job) for job in jobs))
    return 0


def describe(job: Mapping[str, Any]) -> str:
    """One job as `eff` prints it: a line per run, a line per GPU, then its flags."""
    from gpuwarden.base.units import format_size
    from gpuwarden.cli.jobtables import span
    from gpuwarden.files.safefiles import printable
    from gpuwarden.usage import efficiency

    lines = [
        f"job {job['id']} of {printable(str(job['user']))}"
        + (f" (account {printable(str(job['account']))})" if job.get("account") else "")
        + f": {job['state']}"
    ]
    indices = job.get("indices") or {}
    for run in job.get("runs") or []:
        length = (run["ended"] or run["started"]) - run["started"] if run["ended"] else None
        held = run["gpu_seconds"] / 3600.0
        lines.append(
            f"run {run['run']} ({run['state']}): {run['gpus']} GPUs"
            + (f" for {span(length)}" if length is not None else "")
            + f", {held:.2f} GPU-hours held"
        )
        uses = [efficiency.GpuUse(**u) for u in run.get("use") or []]
        if not uses:
            lines.append("  no samples (it ran shorter than service.sample_seconds, or none)")
            continue
        labels = []
        for use in uses:
            index = indices.get(use.gpu)
            label = str(index) if index is not None else use.gpu[:12]
            labels.append(label)
            util = efficiency.mean_util(use)
            mem = "n/a" if use.mem_peak is None else format_size(use.mem_peak)
            total = "" if not use.mem_total else f" of {format_size(use.mem_total)}"
            energy = "n/a" if use.energy is None else f"{use.energy:.0f} J"
            lines.append(
                f"  GPU {label}: utilisation {'n/a' if util is None else f'{util:.0f}%'}, "
                f"memory peak {mem}{total}, energy {energy} "
                f"({use.level} level, sampled {span(use.seconds)})"
            )
        for flag in efficiency.flags(uses, labels):
            lines.append(f"  ! {flag}")
    return "\n".join(lines)
