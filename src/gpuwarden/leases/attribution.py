"""Whose is a GPU process: the one place `status`, `enforce`, the exporter and the web
page tie a process to a lease, its job and its real owner.

A process belongs to a lease when the lease's job is the process or one of its
ancestors (the kernel's /proc), or when it runs in a container labelled with the
lease's job (`gpuwarden run -- podman|docker run ...` labels it; /proc/PID/cgroup names
the container): a container is the child of its runtime, and a rootful runtime's
processes run as root, so without this they would all read "root, without a lease".
The rule itself is `enforcement.lease_of`; here the kernel's and the runtime's facts
are gathered for it.
"""

from __future__ import annotations

from gpuwarden.base.records import replace
from gpuwarden.machine.ancestry import container_job, lineage
from gpuwarden.usage import enforcement as policy

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Sequence
    from typing import Any, Optional


def policy_leases(leases: Sequence[Any]) -> list[policy.Lease]:
    """`leases.LeaseInfo`s as the policies see them."""
    return [
        policy.Lease(x.uuid, x.pid, x.user, x.job, x.mem is not None, x.mem)
        for x in leases
        if not isinstance(x, Exception)
    ]


def use_of(
    gpu: Any,
    process: Any,
    lineage_of: Callable[[int], tuple[int, ...]] = lineage,
    container_of: Callable[[int], Optional[str]] = container_job,
) -> policy.Use:
    """A process on `gpu` with what the kernel and its container runtime say of it."""
    return policy.Use(
        process.pid,
        gpu.uuid,
        process.user,
        process.used_memory,
        lineage_of(process.pid),
        container_of(process.pid),
    )


def unleased_pids(
    gpu: Any, held: Sequence[Any], lineage_of: Callable[[int], tuple[int, ...]] = lineage
) -> set[int]:
    """The pids of `gpu`'s processes that belong to none of the leases `held` on it."""
    leases = [
        policy.Lease(
            gpu.uuid, getattr(x, "pid", None), getattr(x, "user", None), getattr(x, "job", None)
        )
        for x in held
    ]
    return {
        p.pid for p in gpu.processes if policy.lease_of(use_of(gpu, p, lineage_of), leases) is None
    }


def attribute(
    snapshot: Any,
    leases: Sequence[Any],
    lineage_of: Callable[[int], tuple[int, ...]] = lineage,
    container_of: Callable[[int], Optional[str]] = container_job,
) -> Any:
    """`snapshot` with each process of a container started under a lease shown as its
    lease owner's, not as root's: what status, the exporter and the web page show."""
    held = policy_leases(leases)
    if not held:
        return snapshot
    gpus = []
    changed = False
    for gpu in snapshot.gpus:
        procs = []
        for p in gpu.processes:
            use = use_of(gpu, p, lineage_of, container_of)
            owner = policy.owner(use, policy.lease_of(use, held))
            if use.container and owner != p.user:
                p = replace(p, user=owner)
                changed = True
            procs.append(p)
        gpus.append(replace(gpu, processes=tuple(procs)))
    return replace(snapshot, gpus=tuple(gpus)) if changed else snapshot
