"""The machine itself: drained or unhealthy GPUs, memory held out of sight, persistence mode."""

from __future__ import annotations

from gpuwarden.doctor.checks.common import gpu_label
from gpuwarden.doctor.facts import Facts
from gpuwarden.doctor.findings import FAIL, INFO, PASS, WARN, Finding

NAME = "machine"
HIDDEN_MEMORY_SHARE = 0.9  # used/total at or above this with no process listed


def check_machine(facts: Facts) -> list[Finding]:
    snap = facts.snapshot
    if not snap.gpus:
        return []
    found: list[Finding] = []
    found.extend(_drains(facts))
    found.extend(_health(facts))
    found.extend(_sharing(facts))
    for gpu in snap.gpus:
        total, used = gpu.memory_total, gpu.memory_used
        if total and used is not None and not gpu.processes and used >= HIDDEN_MEMORY_SHARE * total:
            found.append(
                Finding(
                    "machine.memory",
                    WARN,
                    f"{gpu_label(gpu)}: {used * 100 // total}% of memory used but no process "
                    "is listed",
                    f"{used >> 20} MiB of {total >> 20} MiB used, NVML lists no process",
                    "the holder runs in another PID namespace (a container) or under a user "
                    "you cannot see: check `docker ps` / `sudo nvidia-smi`; "
                    "`gpuwarden run` will pass this GPU over",
                    gpu.uuid,
                )
            )
    off = [g for g in snap.gpus if g.persistence_mode is False]
    if off and facts.platform.startswith("linux"):
        found.append(
            Finding(
                "machine.persistence",
                INFO,
                f"persistence mode is off on {len(off)} GPU(s): the first NVML/CUDA call after "
                "idle re-initialises the driver (slow start)",
                "GPUs " + ", ".join(str(g.index) for g in off),
                "sudo nvidia-smi -pm 1  (or enable the nvidia-persistenced service)",
            )
        )
    if not any(f.level in (WARN, FAIL) for f in found):
        found.insert(0, Finding(NAME, PASS, f"{len(snap.gpus)} GPU(s) healthy and in service"))
    return found


def _drains(facts: Facts) -> list[Finding]:
    found = []
    by_uuid = {g.uuid: g for g in facts.snapshot.gpus}
    for uuid, drain in sorted(facts.drains.items()):
        gpu = by_uuid.get(uuid)
        label = gpu_label(gpu) if gpu else uuid
        reason = drain.reason or "no reason given"
        by = drain.by
        found.append(
            Finding(
                "machine.drain",
                INFO,
                f"{label} is drained: gpuwarden will not hand it out",
                f"reason: {reason}" + (f" (by {by})" if by else ""),
                f"gpuwarden undrain {gpu.index if gpu else uuid}  (once it is fixed)",
                uuid,
            )
        )
    return found


def _sharing(facts: Facts) -> list[Finding]:
    """Leases kept in a private directory protect a user's jobs from each other only.
    Other users' GPU processes are the sign that the machine is shared. A shared one
    is as safe as a directory every user can write can be, which is not entirely."""
    if facts.lease_dir_shared is True:
        return [
            Finding(
                "machine.lease-trust",
                INFO,
                f"leases are shared between users in {facts.lease_dir}: any local user can "
                "hold its locks, and a directory every user can write can never be made "
                "fully safe against that",
                "gpuwarden refuses what others plant there (FIFOs, links, bad records, "
                "forged pids, crafted tickets) and times out, naming the holder, on a lock "
                "held too long; a user can still hold GPU locks or alloc.lock to block others",
                "the real fix is the per-machine queue service (`gpuwarden serve`, "
                "docs/service.md), which alone writes the leases; see docs/leases.md "
                '("A hostile local user")',
            )
        ]
    if facts.lease_dir_shared is not False:
        return []
    service = facts.service or {}
    if service.get("running") or service.get("installed"):
        return []  # the service owns the leases: the service check says how it stands
    others = sorted(
        {
            p.user
            for g in facts.snapshot.gpus
            for p in g.processes
            if p.user and p.user != facts.user
        }
    )
    seen = f"GPU processes of {', '.join(others)}" if others else "no other user's GPU process"
    return [
        Finding(
            "machine.sharing",
            WARN if others else INFO,
            f"gpuwarden's leases are private to {facts.user or 'you'} ({facts.lease_dir}): "
            "other users' gpuwarden jobs neither see nor respect them",
            seen,
            "on a shared machine an admin runs once: sudo gpuwarden service install (the "
            "queue service: no user can block another); or, for cooperating users only, "
            "sudo install -d -m 1777 /var/lib/gpuwarden/leases /var/lib/gpuwarden/state",
        )
    ]


def _health(facts: Facts) -> list[Finding]:
    from gpuwarden.health.judgement import FATAL, WARNING, judge

    found = []
    for gpu in facts.snapshot.gpus:
        try:
            verdicts = judge(gpu)
        except Exception as exc:
            found.append(
                Finding("machine.health", INFO, f"{gpu_label(gpu)}: health not judged", str(exc))
            )
            continue
        for v in verdicts:
            level = {FATAL: FAIL, WARNING: WARN}.get(v.level)
            if level is None:
                continue
            drained = gpu.uuid in facts.drains
            fix = v.action or ""
            if level == FAIL and not drained:
                fix = (fix + "; " if fix else "") + (
                    f"meanwhile keep jobs off it: gpuwarden drain {gpu.index} --reason '{v.reason}'"
                )
            found.append(
                Finding("machine.health", level, f"{gpu_label(gpu)}: {v.reason}", "", fix, gpu.uuid)
            )
    return found
