"""Stand-ins of the driver's MIG capability files, under a directory the simulator owns.

`gpuwarden.cgroups.migcaps` reads `/proc/devices`, `/proc/driver/nvidia-caps/mig-minors` and
`/proc/driver/nvidia/capabilities/gpu<N>/mig/gi<G>[/ci<C>]/access` under a root; on
a simulated machine that root is `<state>.driver/` beside the machine's state file,
written here from its MIG instances in the driver's own formats:

- `mig-minors` numbers every possible instance as the driver does: `config 1`,
  `monitor 2`, then per GPU minor 15 GPU instances of 9 nodes each (the GI's own,
  then its compute instances 0-7);
- an access file exists for each instance there is, `DeviceFileMinor: M`;
- `nvidia-caps` gets a character major this host has not registered, so a stand-in
  node (`mknod`) of it opens with ENXIO where allowed and EPERM where a cgroup denies.
"""

from __future__ import annotations

import os

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterable
    from typing import Any

GIS, CIS = 15, 8  # GPU instances per GPU and compute instances per GPU instance


def minor(gpu: int, gi: int, ci: Any = None) -> int:
    """The driver's numbering in mig-minors (config 1, monitor 2, then per GPU)."""
    return 3 + gpu * GIS * (CIS + 1) + gi * (CIS + 1) + (0 if ci is None else 1 + ci)


def free_major(devices: str) -> int:
    """A character major no driver here registered (from /proc/devices' text), in the
    range Linux keeps for local use."""
    taken = set()
    for line in devices.splitlines():
        if line.startswith("Block devices"):
            break
        first = line.split()[:1]
        if first and first[0].isdigit():
            taken.add(int(first[0]))
    return next(m for m in range(240, 255) if m not in taken)


def files(gpus: Iterable[dict[str, Any]], major: int) -> dict[str, str]:
    """Path under the root -> text, for a simulated machine's GPUs (its state's)."""
    table = ["config 1", "monitor 2"]
    out: dict[str, str] = {"proc/devices": f"Character devices:\n{major} nvidia-caps\n"}
    for gpu in gpus:
        n = int(gpu["minor"])
        for gi in range(GIS):
            table.append(f"gpu{n}/gi{gi}/access {minor(n, gi)}")
            table.extend(f"gpu{n}/gi{gi}/ci{ci}/access {minor(n, gi, ci)}" for ci in range(CIS))
        if not gpu.get("mig"):
            continue
        for inst in gpu.get("mig_instances", ()):
            gi, ci = int(inst["gpu_instance_id"]), int(inst["compute_instance_id"])
            here = f"proc/driver/nvidia/capabilities/gpu{n}/mig/gi{gi}"
            out[f"{here}/access"] = f"DeviceFileMinor: {minor(n, gi)}\nDeviceFileMode: 292\n"
            out[f"{here}/ci{ci}/access"] = (
                f"DeviceFileMinor: {minor(n, gi, ci)}\nDeviceFileMode: 292\n"
            )
    out["proc/driver/nvidia-caps/mig-minors"] = "\n".join(table) + "\n"
    return out


def provide() -> str:
    """Write the stand-ins for the simulated machine of GPUWARDEN_SIM; their root."""
    from gpuwarden.files.safefiles import write_atomic
    from gpuwarden.sim.machine import Machine

    machine = Machine.open()
    root = os.path.splitext(machine.file.path)[0] + ".driver"
    try:
        with open("/proc/devices", encoding="ascii", errors="replace") as fh:
            host = fh.read(1 << 16)
    except OSError:
        host = ""
    for path, text in files(machine.state()["gpus"], free_major(host)).items():
        full = os.path.join(root, path)
        os.makedirs(os.path.dirname(full), mode=0o755, exist_ok=True)
        write_atomic(full, text, what="simulated driver file", durable=False)
    return root
