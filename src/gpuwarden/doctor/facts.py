"""Everything the doctor judges, gathered in one place into one frozen `Facts` record.

The checks are pure functions of `Facts`, so the expensive or impure parts
live only here: reading the machine (one `Snapshot`), the environment, the
drains, and PyTorch's build.

PyTorch is found without importing it in this process: importing torch costs
a second or more and the CLI must stay cheap. Its release and CUDA version
come from `torch/version.py` read as text (located with `find_spec`, which
does not import the package). What only torch itself can say (the compiled
architecture list, NCCL, cuDNN, MPS) comes from a short probe run in a child
interpreter, started before the NVML snapshot is read so the two overlap.
Without the probe (`probe_torch=False`), the architecture list is taken from
the table of official wheels for that build (`cuda_compat.WHEELS`).

In-process (`gpuwarden.doctor.check()` from a user's script), a torch that is
already imported is asked directly; nothing imports it.
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Optional

from gpuwarden.base.records import field, record

# The probe lives in its own module so the CLI can start it first.
from gpuwarden.doctor.probe import NO_TORCH_ENV, PROBE_TIMEOUT, torch_location
from gpuwarden.doctor.probe import start as start_probe
from gpuwarden.machine.inventory import Snapshot

if TYPE_CHECKING:
    import subprocess

    from gpuwarden.config import Config


@record
class TorchBuild:
    """What is known about the installed PyTorch; `None` fields are unknown, not false."""

    installed: bool
    version: Optional[str] = None  # "2.6.0+cu126"
    cuda: Optional[str] = None  # torch.version.cuda, None for CPU/ROCm builds
    hip: Optional[str] = None
    location: Optional[str] = None
    arch_list: Optional[tuple[str, ...]] = None
    arch_source: str = ""  # "torch" or "official cu126 wheel table"
    distributed: Optional[bool] = None
    nccl: Optional[bool] = None
    nccl_version: Optional[str] = None
    cudnn: Optional[int] = None
    mps: Optional[bool] = None
    error: Optional[str] = None  # why some facts are missing (probe failed, ...)
    skipped: str = ""  # why torch was not looked at, when it was not


@record
class TorchRuntime:
    """The torch already imported in this process (in-process mode only)."""

    cuda_initialized: bool
    device_uuids: Optional[tuple[str, ...]] = None  # what CUDA enumerated, in its order
    device_count: Optional[int] = None


@record
class Facts:
    """Everything the doctor's checks judge, read once (pure checks take it as input)."""

    snapshot: Snapshot
    environ: Mapping[str, str] = field(default_factory=dict)
    torch: TorchBuild = field(default_factory=lambda: TorchBuild(installed=False))
    platform: str = "linux"  # sys.platform
    machine: str = "x86_64"
    python: str = ""
    drains: Mapping[str, Any] = field(default_factory=dict)  # uuid -> gpuwarden.health.drain.Drain
    in_process: bool = False
    runtime: Optional[TorchRuntime] = None  # torch state, when torch is imported here
    initial_environ: Optional[Mapping[str, str]] = None  # the environment at exec time
    user: str = ""  # who runs the doctor
    lease_dir: str = ""  # where this user's gpuwarden keeps its leases
    # Whether other users' gpuwarden jobs use the same lease directory (sticky and
    # world-writable, like /var/lib/gpuwarden/leases); None when it could not be told.
    lease_dir_shared: Optional[bool] = None
    # (mode, why): the device isolation `gpuwarden run` gets here (cgroups.hierarchy.judge).
    enforcement: Optional[tuple[str, str]] = None
    # What `gpuwarden.queueclient.probe.probe()` found at the service's socket (running,
    # problem, versions, who we are to it); None when it was not asked.
    service: Optional[Mapping[str, Any]] = None
    # Container runtimes and what lets them go around leases (read_containers).
    containers: Optional[Mapping[str, Any]] = None


# -- torch, without importing it --------------------------------------------------------


def _read_version_py(path: str) -> dict[str, Any]:
    """The literal assignments of torch/version.py (`cuda: Optional[str] = '12.6'`)."""
    import ast

    try:
        with open(path, encoding="utf-8") as fh:
            text = fh.read()
    except OSError:
        return {}
    values: dict[str, Any] = {}
    for m in re.finditer(r"^(\w+)\s*(?::[^=\n]*)?=\s*(.+)$", text, re.MULTILINE):
        try:
            values[m.group(1)] = ast.literal_eval(m.group(2).strip())
        except (ValueError, SyntaxError):
            continue
    return values


def find_torch(environ: Mapping[str, str]) -> TorchBuild:
    """Locate torch and read its version file, importing nothing."""
    if environ.get(NO_TORCH_ENV, "") not in ("", "0"):
        return TorchBuild(installed=False, skipped=f"{NO_TORCH_ENV} is set")
    location = torch_location(environ)
    if location is None:
        return TorchBuild(installed=False, skipped="torch is not installed")
    values = _read_version_py(os.path.join(location, "version.py"))
    version = values.get("__version__")
    return TorchBuild(
        installed=True,
        version=str(version) if version else None,
        cuda=values.get("cuda"),
        hip=values.get("hip"),
        location=location,
        error=None if version else "torch/version.py unreadable",
    )


def finish_probe(build: TorchBuild, proc: subprocess.Popen[str]) -> TorchBuild:
    """Merge the child's answer into `build`; a failed probe keeps the static facts."""
    import json
    import subprocess

    try:
        out, err = proc.communicate(timeout=PROBE_TIMEOUT)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        return _with(build, error=f"torch probe took over {PROBE_TIMEOUT:.0f} s")
    try:
        data = json.loads(out.strip().splitlines()[-1])
    except (ValueError, IndexError):
        tail = (err or out).strip().splitlines()[-1:] or ["no output"]
        return _with(build, error=f"torch probe failed: {tail[0]}")
    return probe_result(build, data)


def probe_result(build: TorchBuild, data: Mapping[str, Any]) -> TorchBuild:
    if "error" in data:
        return _with(build, error=str(data["error"]))
    archs = data.get("arch_list")
    return _with(
        build,
        version=data.get("version") or build.version,
        cuda=data.get("cuda", build.cuda),
        hip=data.get("hip", build.hip),
        arch_list=tuple(archs) if isinstance(archs, list) else None,
        arch_source="torch" if isinstance(archs, list) else "",
        distributed=data.get("distributed"),
        nccl=data.get("nccl"),
        nccl_version=data.get("nccl_version"),
        cudnn=data.get("cudnn"),
        mps=data.get("mps"),
        error="; ".join(data["errors"]) if data.get("errors") else None,
    )


def from_module(torch: Any) -> tuple[TorchBuild, TorchRuntime]:
    """Facts from a torch that this process already imported."""
    data: dict[str, Any] = {}
    errors = []
    for name, fn in (
        ("version", lambda: torch.__version__),
        ("cuda", lambda: torch.version.cuda),
        ("hip", lambda: getattr(torch.version, "hip", None)),
        (
            "arch_list",
            lambda: (
                (torch._C._cuda_getArchFlags() or "").split()
                if hasattr(torch._C, "_cuda_getArchFlags")
                else []
            ),
        ),
        ("distributed", lambda: torch.distributed.is_available()),
        (
            "nccl",
            lambda: bool(
                torch.distributed.is_available() and torch.distributed.is_nccl_available()
            ),
        ),
        ("mps", lambda: torch.backends.mps.is_built()),
    ):
        try:
            data[name] = fn()
        except Exception as exc:
            errors.append(f"{name}: {exc}")
    if errors:
        data["errors"] = errors
    build = probe_result(
        TorchBuild(installed=True, location=os.path.dirname(getattr(torch, "__file__", "") or "")),
        data,
    )
    initialized = False
    uuids: Optional[tuple[str, ...]] = None
    count: Optional[int] = None
    try:
        initialized = bool(torch.cuda.is_initialized())
        if initialized:
            count = int(torch.cuda.device_count())
            found = []
            for i in range(count):
                uuid = getattr(torch.cuda.get_device_properties(i), "uuid", None)
                if uuid is None:
                    break
                text = str(uuid)
                found.append(text if text.startswith(("GPU-", "MIG-")) else f"GPU-{text}")
            else:
                uuids = tuple(found)
    except Exception:
        pass
    return build, TorchRuntime(cuda_initialized=initialized, device_uuids=uuids, device_count=count)


def _with(build: TorchBuild, **changes: Any) -> TorchBuild:
    from dataclasses import replace

    return replace(build, **changes)


def table_archs(build: TorchBuild) -> TorchBuild:
    """Fill the arch list from the official wheel table when torch itself was not asked."""
    if not build.installed or build.arch_list is not None or not build.cuda:
        return build
    from gpuwarden.doctor import cuda_compat

    variant = cuda_compat.variant_of(build.version, build.cuda)
    wheel = (
        cuda_compat.wheel_archs(variant, cuda_compat.parse_version(build.version))
        if variant
        else None
    )
    if wheel is None:
        return build
    return _with(build, arch_list=wheel.archs, arch_source=f"official {variant} wheel table")


# -- the machine and the rest -----------------------------------------------------------


def read_machine() -> Snapshot:
    """One snapshot; a machine without a usable NVML is an empty snapshot saying why."""
    from gpuwarden.machine import inventory

    try:
        return inventory.read_snapshot(processes=True)
    except ImportError as exc:
        reason = f"NVML not loadable: {exc}"
    except Exception as exc:  # a broken driver must not stop the doctor
        reason = f"NVML failed: {type(exc).__name__}: {exc}"
    import socket

    return Snapshot(taken_at=time.time(), hostname=socket.gethostname(), error=reason)


def read_drains() -> Mapping[str, Any]:
    try:
        from gpuwarden.health.drain import list_drains

        return dict(list_drains())
    except Exception:
        return {}


def read_lease_dir() -> tuple[str, Optional[bool]]:
    """The lease directory and whether it is shared between users. One that does not
    exist yet is private: gpuwarden creates a missing one per user, mode 0700."""
    import stat

    from gpuwarden.base.errors import UserError
    from gpuwarden.files.locations import lease_location

    try:
        path = lease_location()
    except UserError:
        return "", None  # a broken config is the config check's finding, not this one
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        return path, False
    except OSError:
        return path, None
    return path, bool(mode & stat.S_ISVTX and mode & stat.S_IWOTH)


def read_config() -> Optional[Config]:
    """This user's reading of the configuration, or None where it is broken: that is the
    config check's finding, and the other facts go on without it."""
    from gpuwarden import config
    from gpuwarden.base.errors import UserError

    try:
        return config.load()
    except UserError:
        return None


def read_service(
    lease_dir: Optional[str] = None, socket: Optional[str] = None
) -> Optional[Mapping[str, Any]]:
    """Whether a queue service answers at `socket` (the configured one), and to this
    user, and whether one is installed (its unit, or a lease directory that is root's
    and closed to us, as `service install` leaves it); never raises: a doctor with a
    broken service to report must still report everything else."""
    if socket is None:
        return None
    try:
        from gpuwarden.queueclient.probe import UNIT_PATH, probe

        found = dict(probe(socket))
        installed = os.path.exists(UNIT_PATH)
        if not installed and lease_dir and os.geteuid() != 0:
            with contextlib.suppress(OSError):
                st = os.stat(lease_dir)
                installed = st.st_uid == 0 and not os.access(lease_dir, os.W_OK)
        found["installed"] = installed
        return found
    except Exception:
        return None


def initial_environ() -> Optional[dict[str, str]]:
    """The environment this process was started with (Linux /proc), to see later changes."""
    try:
        with open("/proc/self/environ", "rb") as fh:
            raw = fh.read()
    except OSError:
        return None
    env = {}
    for item in raw.split(b"\0"):
        if b"=" in item:
            k, _, v = item.partition(b"=")
            env[k.decode(errors="replace")] = v.decode(errors="replace")
    return env


def gather(
    *,
    environ: Optional[Mapping[str, str]] = None,
    probe_torch: bool = True,
    in_process: bool = False,
    snapshot: Optional[Snapshot] = None,
    probe: Optional[subprocess.Popen[str]] = None,
) -> Facts:
    """Collect every fact once. `probe_torch=False` never starts torch anywhere.

    `probe` is a torch probe the caller already started (`probe.start_if_wanted`),
    so that it runs while the caller imports the rest of the doctor."""
    env = dict(os.environ if environ is None else environ)
    runtime: Optional[TorchRuntime] = None
    loaded = sys.modules.get("torch") if env.get(NO_TORCH_ENV, "") in ("", "0") else None
    proc = None
    if loaded is not None and hasattr(loaded, "version"):
        build, runtime = from_module(loaded)
    else:
        build = find_torch(env)
        if build.installed and probe_torch:
            proc, probe = probe, None
            if proc is None:
                try:
                    proc = start_probe()
                except OSError as exc:
                    build = _with(build, error=f"torch probe could not start: {exc}")
    if probe is not None:  # started, but this environment does not want it
        probe.kill()
        probe.communicate()
    snap = snapshot if snapshot is not None else read_machine()
    drains = read_drains()
    lease_dir, lease_dir_shared = read_lease_dir()
    reading = read_config()
    service = read_service(lease_dir, reading.service_socket() if reading else None)
    if proc is not None:
        build = finish_probe(build, proc)
    build = table_archs(build)
    return Facts(
        snapshot=snap,
        environ=env,
        torch=build,
        platform=sys.platform,
        machine=os.uname().machine if hasattr(os, "uname") else "",
        python=".".join(str(p) for p in sys.version_info[:3]),
        drains=drains,
        in_process=in_process,
        runtime=runtime if in_process else None,
        initial_environ=initial_environ() if in_process else None,
        user=_user_name(),
        lease_dir=lease_dir,
        lease_dir_shared=lease_dir_shared,
        enforcement=read_enforcement(reading),
        service=service,
        containers=read_containers(),
    )


TOOLKIT_CONFIG = "/etc/nvidia-container-runtime/config.toml"
_ENVVAR_KEY = "accept-nvidia-visible-devices-envvar-when-unprivileged"


def read_containers(toolkit: str = TOOLKIT_CONFIG) -> dict[str, Any]:
    """Container runtimes on PATH, the docker group's listed members, whether the NVIDIA
    toolkit accepts NVIDIA_VISIBLE_DEVICES from unprivileged containers (its default
    when the key is absent; None without the toolkit), and the CDI spec."""
    import grp
    import shutil

    from gpuwarden.containers import RUNTIMES
    from gpuwarden.containers.command import cdi_spec

    try:
        members = sorted(grp.getgrnam("docker").gr_mem)
    except KeyError:
        members = []
    envvar: Optional[bool] = None
    try:
        with open(toolkit, encoding="utf-8", errors="replace") as fh:
            envvar = True
            for line in fh:
                key, eq, value = line.partition("=")
                if eq and key.strip() == _ENVVAR_KEY:  # a commented-out line starts with #
                    envvar = value.split("#")[0].strip().lower() == "true"
    except OSError:
        pass
    return {
        "runtimes": [r for r in RUNTIMES if shutil.which(r)],
        "docker_group": members,
        "toolkit": toolkit,
        "toolkit_envvar": envvar,
        "cdi": cdi_spec(),
    }


def read_enforcement(reading: Optional[Config]) -> Optional[tuple[str, str]]:
    from gpuwarden.cgroups.hierarchy import detect

    # a broken config (None) is the config check's finding, not this one's
    setting = reading.get("enforce.devices") if reading is not None else "auto"
    if setting == "off":
        return "none", "enforce.devices = off"
    return detect()


def _user_name() -> str:
    from gpuwarden.files.paths import user_name

    return user_name()
