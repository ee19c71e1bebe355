"""Containers under a lease (docs/containers.md), in two parts:

- `command`: the command line `gpuwarden run` hands Docker, Podman or Apptainer for
  a lease: exactly the leased GPUs, the lease's descriptors, the job's environment,
  the labels `status` and `enforce` read back; options that would widen what the
  container sees are refused (pure, but for looking for a CDI spec);
- `runtime`: starting the runtime's client with the lease descriptors, stopping the
  container on Ctrl-C and SIGTERM, Docker's keeper, and the job the queue service
  runs for a container command (`python -m gpuwarden.containers.runtime`).

Which container a GPU process runs in, and whose it is, is `ancestry` and
`attribution`: every view reads them, not only a container's job.

This file imports nothing of gpuwarden, so `doctor` and `submit` load the command line
alone, and `run` neither for a job that starts no container (`runtime_of`).
"""

from __future__ import annotations

import os

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Sequence
    from typing import Optional

DAEMONS = ("docker", "podman")  # runtimes whose containers are not our children
CHILDREN = ("apptainer", "singularity")  # the container is a child: fds and env pass in
RUNTIMES = DAEMONS + CHILDREN


def runtime_of(argv: Sequence[str]) -> Optional[str]:
    """`docker`, `podman`, `apptainer` or `singularity` when `argv` runs that program."""
    if not argv:
        return None
    name = os.path.basename(argv[0])
    return name if name in RUNTIMES else None
