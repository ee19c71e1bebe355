"""Which device isolation `gpuwarden run` gets here (none, cgroup v1, cgroup v2 BPF,
systemd), and why: on a shared server, without it any job can open any GPU."""

from __future__ import annotations

from gpuwarden.doctor.facts import Facts
from gpuwarden.doctor.findings import INFO, PASS, WARN, Finding

NAME = "enforcement"


def check_enforcement(facts: Facts) -> list[Finding]:
    if facts.enforcement is None or not facts.snapshot.gpus:
        return []
    mode, why = facts.enforcement
    if mode != "none":
        return [
            Finding(
                NAME,
                PASS,
                f"device isolation: {mode}: a job run as root opens only its leased GPUs",
                why,
            )
        ]
    if why.startswith("enforce.devices"):
        fix = "remove enforce.devices = off to isolate jobs where gpuwarden runs as root"
    elif why.startswith("not root"):
        fix = "jobs are isolated when gpuwarden run (or the service) runs as root"
    else:
        fix = "see docs/enforcement.md for what this machine would need"
    shared = facts.lease_dir_shared is True
    return [
        Finding(
            NAME,
            WARN if shared else INFO,
            "no device isolation: a job can open GPUs it did not lease"
            + (" (this machine is shared)" if shared else ""),
            why,
            fix,
        )
    ]
