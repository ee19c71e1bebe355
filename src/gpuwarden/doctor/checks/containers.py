"""Where containers can use GPUs without a lease (docs/containers.md): members of the
`docker` group (root-equivalent: `docker run --gpus all`), the NVIDIA container toolkit
accepting `NVIDIA_VISIBLE_DEVICES` from unprivileged containers, and no CDI spec (without
one, MIG devices cannot be passed and Docker needs its NVIDIA runtime)."""

from __future__ import annotations

from gpuwarden.doctor.facts import Facts
from gpuwarden.doctor.findings import INFO, PASS, WARN, Finding

NAME = "containers"
ENVVAR_KEY = "accept-nvidia-visible-devices-envvar-when-unprivileged"
CDI_FIX = "sudo nvidia-ctk cdi generate --output=/etc/cdi/nvidia.yaml"


def check_containers(facts: Facts) -> list[Finding]:
    seen = facts.containers
    if seen is None or not seen.get("runtimes") or not facts.snapshot.gpus:
        return []
    found = []
    members = list(seen.get("docker_group") or ())
    if "docker" in seen["runtimes"] and members:
        found.append(
            Finding(
                NAME,
                WARN,
                "members of the docker group can use any GPU without a lease: "
                + ", ".join(members),
                "the docker group is root-equivalent: `docker run --gpus all` needs no lease",
                "remove them from the group; give them rootless Podman under `gpuwarden run`",
            )
        )
    if seen.get("toolkit_envvar") is True:
        found.append(
            Finding(
                NAME,
                WARN,
                "any container that sets NVIDIA_VISIBLE_DEVICES=all gets every GPU",
                f"{ENVVAR_KEY} = true (or absent) in {seen['toolkit']}",
                "set it to false; gpuwarden passes GPUs as --gpus or CDI devices",
            )
        )
    cdi = seen.get("cdi")
    if cdi:
        found.append(Finding(NAME, PASS, f"CDI spec {cdi}: containers get their GPUs by UUID", ""))
    else:
        found.append(
            Finding(
                NAME,
                INFO,
                "no CDI spec for NVIDIA GPUs: containers get device nodes (Podman) or "
                "--gpus (Docker); MIG devices cannot be passed",
                "no nvidia*.yaml in /etc/cdi or /var/run/cdi",
                CDI_FIX,
            )
        )
    return found
