"""Containers under a lease: the command line `gpuwarden run` hands a container runtime.

A container started by `docker run` or `podman run` is not the child of the command
`gpuwarden run` starts: it is the daemon's (Docker) or conmon's (Podman), it inherits
neither the lease lock nor `CUDA_VISIBLE_DEVICES`, and without device options it sees
every GPU or none. So the runtime's own command line is rewritten here, purely:

* exactly the leased GPUs go in, by UUID through CDI (`--device nvidia.com/gpu=UUID`)
  where a CDI spec exists, else as device nodes (`--device /dev/nvidiaN` and the
  control nodes) for Podman, or `--gpus device=UUID,...` for Docker's NVIDIA runtime;
* the container's `CUDA_VISIBLE_DEVICES` names them by UUID (right whatever the
  container numbers them) and `NVIDIA_VISIBLE_DEVICES` too, so an image that says
  `all` does not widen the set under the NVIDIA toolkit's hook;
* the container is named after its job and labelled `gpuwarden.lease`, `gpuwarden.user`
  and `gpuwarden.gpus`, which `status` and `enforce` read back (gpuwarden.machine.ancestry);
* with Podman, the lease's lock descriptors are passed into the container
  (`--preserve-fds`): the kernel then holds the lease exactly as long as the container's
  processes, whatever happens to the client. Docker's daemon cannot be handed
  descriptors: a small keeper process holds them until the client has ended and then
  `docker wait NAME` says the container has too. (That runtime part, and the job a queue
  service runs for a container command, are gpuwarden.containers.runtime.)

Options that would widen what the container sees (`--gpus`, `--privileged`, a GPU
`--device`, `NVIDIA_VISIBLE_DEVICES`/`CUDA_VISIBLE_DEVICES` given with `-e`) are refused
with one line. Apptainer and Singularity run the container as a child with the host's
environment: only their `*ENV_` variables are added, for `--cleanenv`.
"""

from __future__ import annotations

import os

from gpuwarden.base.errors import UserError
from gpuwarden.containers import CHILDREN, DAEMONS, runtime_of

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping, Sequence
    from typing import Any, Optional


CDI_DIRS = ("/etc/cdi", "/var/run/cdi")
CONTROL_NODES = ("nvidiactl", "nvidia-uvm", "nvidia-uvm-tools")

# Options of `docker run`/`podman run` that take no value; every other option takes one
# (as `--opt VALUE` or `--opt=VALUE`). Short flags that take none may be bundled: -it.
_FLAGS = frozenset(
    [
        "--rm",
        "--detach",
        "--interactive",
        "--tty",
        "--init",
        "--privileged",
        "--read-only",
        "--publish-all",
        "--no-healthcheck",
        "--oom-kill-disable",
        "--sig-proxy",
        "--disable-content-trust",
        "--quiet",
        "--replace",
        "--rmi",
        "--no-hosts",
        "--env-host",
        "--read-only-tmpfs",
        "--help",
        "--http-proxy",
        "--tls-verify",
        "--passwd",
        "--use-api-version",
    ]
)
_SHORT_FLAGS = frozenset("ditPq")
# Global options of the runtime (before `run`) that take a value.
_GLOBAL_VALUES = frozenset(
    [
        "--root",
        "--runroot",
        "--log-level",
        "--url",
        "--connection",
        "-c",
        "--context",
        "-H",
        "--host",
        "--config",
        "--cgroup-manager",
        "--storage-driver",
        "--runtime",
        "--tmpdir",
        "--events-backend",
    ]
)
_WIDENING_ENV = ("NVIDIA_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES")


def run_position(argv: Sequence[str]) -> Optional[int]:
    """The index of `run` in `docker|podman [global options] [container] run ...`; None for
    any other subcommand (`ps`, `build`: nothing to put under a lease)."""
    i = 1
    while i < len(argv):
        word = argv[i]
        if word == "container":
            i += 1
            continue
        if word.startswith("-"):
            i += 2 if word in _GLOBAL_VALUES else 1
            continue
        return i if word == "run" else None
    return None


def options(args: Sequence[str]) -> list[tuple[str, Optional[str]]]:
    """The (option, value) pairs of `run`'s options in `args` (which start after `run`),
    up to the image; a flag's value is None, a bundle `-it` gives `-i` and `-t`."""
    found: list[tuple[str, Optional[str]]] = []
    i = 0
    while i < len(args):
        word = args[i]
        if word == "--" or not word.startswith("-") or word == "-":
            break
        if word.startswith("--"):
            name, eq, value = word.partition("=")
            if eq or name in _FLAGS:
                found.append((name, value if eq else None))
                i += 1
            else:
                found.append((name, args[i + 1] if i + 1 < len(args) else None))
                i += 2
            continue
        letters = word[1:]
        if all(c in _SHORT_FLAGS for c in letters):
            found.extend((f"-{c}", None) for c in letters)
            i += 1
        elif len(letters) > 1:  # -eVAR=1: the value is attached
            found.append((f"-{letters[0]}", letters[1:]))
            i += 1
        else:
            found.append((word, args[i + 1] if i + 1 < len(args) else None))
            i += 2
    return found


def refuse_widening(opts: Iterable[tuple[str, Optional[str]]]) -> Optional[str]:
    """Why the user's options would let the container see GPUs beyond the lease; None
    when they do not. gpuwarden passes the leased GPUs itself."""
    for name, value in opts:
        text = value or ""
        if name == "--gpus":
            return f"--gpus {text}"
        if name == "--privileged" and text not in ("false", "False"):
            return "--privileged (it sees every device)"
        if name == "--device" and (
            text.startswith("/dev/nvidia") or text.startswith("nvidia.com/")
        ):
            return f"--device {text}"
        if name in ("-e", "--env") and text.partition("=")[0] in _WIDENING_ENV:
            return f"{name} {text}"
    return None


def cdi_spec(dirs: Sequence[str] = CDI_DIRS) -> Optional[str]:
    """The path of a CDI spec for NVIDIA GPUs (`nvidia-ctk cdi generate` writes
    /etc/cdi/nvidia.yaml), or None."""
    for folder in dirs:
        try:
            names = sorted(os.listdir(folder))
        except OSError:
            continue
        for name in names:
            if name.startswith("nvidia") and name.endswith((".yaml", ".yml", ".json")):
                return os.path.join(folder, name)
    return None


def device_mode(runtime: str, cdi: bool) -> str:
    """How the GPUs go in: `cdi` where a spec exists; else `gpus` (Docker's NVIDIA
    runtime) for Docker and `nodes` (plain device nodes) for Podman."""
    if cdi:
        return "cdi"
    return "gpus" if runtime == "docker" else "nodes"


def device_options(gpus: Sequence[Any], mode: str, dev: str = "/dev") -> list[str]:
    """The options that pass exactly `gpus` into the container, by `mode`. Device nodes
    need each GPU's minor (NVML's) and the control nodes present under `dev`."""
    uuids = [g.uuid for g in gpus]
    if not gpus:
        return []
    if mode == "cdi":
        return [f"--device=nvidia.com/gpu={u}" for u in uuids]
    if mode == "gpus":
        return ["--gpus", f'"device={",".join(uuids)}"']
    out = []
    for g in gpus:
        if g.uuid.startswith("MIG-"):
            raise UserError(
                f"{g.uuid} is a MIG device: passing it into a container needs a CDI spec "
                "(`nvidia-ctk cdi generate --output=/etc/cdi/nvidia.yaml`)"
            )
        if getattr(g, "minor", None) is None:
            raise UserError(f"NVML gives no minor number for GPU {g.index}: no device node to pass")
        out.append(f"--device={dev}/nvidia{g.minor}:/dev/nvidia{g.minor}")
    for name in CONTROL_NODES:
        if os.path.exists(f"{dev}/{name}"):
            out.append(f"--device={dev}/{name}:/dev/{name}")
    return out


def container_name(job: str) -> str:
    return f"gpuwarden-{job}"


class Plan:
    """What to start instead of the user's command: `argv`, the extra environment of
    the runtime process (`env`), the container's name (None for Apptainer), whether the
    lease descriptors go in at fd 3, 4, ... (`preserve`: Podman's --preserve-fds), and
    whether a keeper holds the lease until the container ends (`keeper`: Docker)."""

    def __init__(
        self,
        runtime: str,
        argv: list[str],
        name: Optional[str],
        env: dict[str, str],
        preserve: bool,
        keeper: bool = False,
    ) -> None:
        self.runtime = runtime
        self.argv = argv
        self.name = name
        self.env = env
        self.preserve = preserve
        self.keeper = keeper


def plan(
    argv: Sequence[str],
    gpus: Sequence[Any],
    job: Optional[str],
    uid: int,
    *,
    nfds: int = 0,
    cdi: bool = False,
    dev: str = "/dev",
    extra_env: Optional[Mapping[str, str]] = None,
    name: Optional[str] = None,
) -> Optional[Plan]:
    """The container command rewritten for a lease on `gpus` held by job `job` of user
    `uid`, or None when `argv` starts no container. `extra_env` is what the job would
    have been given (GPUWARDEN_*, the mem limit), passed into the container too; `name`
    is the container's unless the command names it."""
    runtime = runtime_of(argv)
    if runtime is None:
        return None
    uuids = ",".join(g.uuid for g in gpus)
    inside = {
        "CUDA_VISIBLE_DEVICES": uuids,
        "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
        **(extra_env or {}),
    }
    if runtime in CHILDREN:
        # A child process with the host's environment; its *ENV_ variables reach the
        # container even under --cleanenv. --nv binds every node: the variables choose.
        prefix = runtime.upper() + "ENV_"
        return Plan(runtime, list(argv), None, {prefix + k: v for k, v in inside.items()}, False)
    at = run_position(argv)
    if at is None:
        return None
    rest = list(argv[at + 1 :])
    opts = options(rest)
    bad = refuse_widening(opts)
    if bad is not None:
        raise UserError(
            f"{runtime} run {bad} would let the container see GPUs outside its lease: "
            "leave it out, gpuwarden passes the leased GPUs in itself"
        )
    given = [value for name, value in opts if name == "--name" and value]
    name = given[-1] if given else (name or container_name(job or str(os.getpid())))
    added: list[str] = [] if given else [f"--name={name}"]
    mode = device_mode(runtime, cdi)
    added += device_options(gpus, mode, dev)
    if job is not None:
        added.append(f"--label=gpuwarden.lease={job}")
    added += [f"--label=gpuwarden.user={uid}", f"--label=gpuwarden.gpus={uuids}"]
    inside["NVIDIA_VISIBLE_DEVICES"] = uuids or "void"
    added += [f"--env={k}={v}" for k, v in inside.items()]
    preserve = runtime == "podman" and nfds > 0
    if preserve:
        added.append(f"--preserve-fds={nfds}")
    keeper = runtime == "docker" and nfds > 0
    return Plan(runtime, [*argv[: at + 1], *added, *rest], name, {}, preserve, keeper)


# --- inside a queue service's job ---------------------------------------------------------------


def plan_here(
    argv: Sequence[str],
    gpus: Sequence[Any],
    job: Optional[str],
    nfds: int,
    env: Mapping[str, str],
    dev: str,
    name: Optional[str] = None,
) -> Optional[Plan]:
    """`plan` for a job of this process's user, as `gpuwarden run` and the queue
    service's container job both start one: CDI devices when this machine has a spec,
    and the job's own GPUWARDEN_* variables of `env` passed into the container."""
    if runtime_of(argv) is None:
        return None
    from gpuwarden.jobs.launch import OURS

    return plan(
        argv,
        gpus,
        job,
        os.getuid(),
        nfds=nfds,
        cdi=cdi_spec() is not None,
        dev=dev,
        extra_env={k: env[k] for k in OURS if k in env},
        name=name,
    )


def through_service(
    argv: Sequence[str], dev: Optional[str] = None, python: Optional[str] = None
) -> list[str]:
    """The argv to hand the queue service for a container command: this module's `main`
    in front, run by `python` (the client's interpreter, this one by default), which
    rewrites the command once the service has chosen the GPUs (the client cannot: it
    does not know them yet). Any other command is returned as it is."""
    runtime = runtime_of(argv)
    if runtime is None or (runtime in DAEMONS and run_position(argv) is None):
        return list(argv)
    import sys

    return [
        python or sys.executable,
        "-m",
        "gpuwarden.containers.runtime",
        *(["--dev", dev] if dev else []),
        "--",
        *argv,
    ]
