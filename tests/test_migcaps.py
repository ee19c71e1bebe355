"""Fencing per MIG slice: a job on one slice opens only that slice's capability nodes.

The numbers come from the driver's files (gpuwarden.migcaps), which the simulator
stands in for under its own directory (gpuwarden.sim.driverfiles). As for whole GPUs
(tests/test_cgroups.py), nodes made with `mknod` tell allowed from denied without a
driver: opening one gives ENXIO where the job's cgroup allows it, EPERM where it denies.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

from conftest import SRC, require
from gpuwarden import cgroups, migcaps
from gpuwarden.inventory import read_snapshot
from gpuwarden.sim import driverfiles

PROBE = textwrap.dedent("""\
    import json, os, sys
    res = {}
    for name in sorted(os.listdir(sys.argv[1])):
        try:
            os.close(os.open(os.path.join(sys.argv[1], name), os.O_RDWR))
            res[name] = "open"
        except OSError as err:
            res[name] = {1: "EPERM", 6: "ENXIO"}.get(err.errno, str(err.errno))
    print(json.dumps(res))
""")


def test_the_driver_files_are_read_as_the_driver_writes_them(tmp_path: Path) -> None:
    (tmp_path / "proc/driver/nvidia-caps").mkdir(parents=True)
    (tmp_path / "proc/devices").write_text(
        "Character devices:\n195 nvidia\n237 nvidia-caps\n\nBlock devices:\n238 nvidia-caps\n"
    )
    (tmp_path / "proc/driver/nvidia-caps/mig-minors").write_text(
        "config 1\nmonitor 2\ngpu1/gi2/access 21\ngpu1/gi2/ci0/access 22\ngarbage line\n"
    )
    gi = tmp_path / "proc/driver/nvidia/capabilities/gpu1/mig/gi2"
    (gi / "ci0").mkdir(parents=True)
    (gi / "access").write_text("DeviceFileMinor: 21\nDeviceFileMode: 292\n")
    (gi / "ci0/access").write_text("no minor here\n")  # then mig-minors says it
    other = tmp_path / "proc/driver/nvidia/capabilities/gpu1/mig/gi9"
    other.mkdir()
    (other / "access").write_text("DeviceFileMinor: 84\n")
    (tmp_path / "proc/driver/nvidia/capabilities/gpuX/mig").mkdir(parents=True)  # ignored
    caps = migcaps.read(str(tmp_path))
    assert caps is not None and caps.major == 237
    assert caps.minors == {(1, 2, None): 21, (1, 2, 0): 22, (1, 9, None): 84}
    assert migcaps.deny_rules(caps, [(1, 2, 0)]) == ["c 237:84 rwm"]
    assert migcaps.deny_rules(caps, []) == ["c 237:21 rwm", "c 237:22 rwm", "c 237:84 rwm"]
    assert migcaps.read(str(tmp_path / "nothing")) is None  # no driver files: nothing to fence


def test_the_simulators_stand_ins_number_instances_as_the_driver_does() -> None:
    gpu = {"minor": 3, "mig": True, "mig_instances": [
        {"gpu_instance_id": 2, "compute_instance_id": 0},
    ]}  # fmt: skip
    made = driverfiles.files([gpu], 241)
    assert driverfiles.minor(0, 0) == 3 and driverfiles.minor(0, 0, 0) == 4
    assert driverfiles.minor(0, 1) == 12  # 9 nodes per GPU instance
    assert made["proc/driver/nvidia/capabilities/gpu3/mig/gi2/access"].startswith(
        f"DeviceFileMinor: {driverfiles.minor(3, 2)}\n"
    )
    table = migcaps.parse_table(made["proc/driver/nvidia-caps/mig-minors"])
    assert table[(3, 2, 0)] == driverfiles.minor(3, 2, 0) and len(table) == 15 * 9
    assert (
        driverfiles.free_major("Character devices:\n240 a\n241 b\nBlock devices:\n242 c\n") == 242
    )


def test_a_job_on_one_slice_is_denied_the_other_slices_caps(
    tmp_path: Path, sim: Any, cli: Any
) -> None:
    mode, why = cgroups.detect()
    require(mode == "cgroup-v1", f"no device isolation here ({why})")
    sim("mixed")
    caps = migcaps.read(migcaps.driver_root())
    assert caps is not None
    a100 = read_snapshot().gpus[3]
    slices = {m.name: (a100.minor, m.gpu_instance_id) for m in a100.mig_instances}
    dev = tmp_path / "dev"
    dev.mkdir()
    os.mknod(dev / f"nvidia{a100.minor}", 0o666 | 0o020000, os.makedev(195, a100.minor))
    for (_gpu, gi, ci), minor in caps.minors.items():
        name = f"cap-gi{gi}" + ("" if ci is None else f"-ci{ci}")
        os.mknod(dev / name, 0o666 | 0o020000, os.makedev(caps.major, minor))
    (tmp_path / "probe.py").write_text(PROBE)
    env = {"PYTHONPATH": str(SRC)}
    job = cli("run", "--mig", "2g.20gb", "--", sys.executable, str(tmp_path / "probe.py"), str(dev))
    assert job.returncode == 0, job.stderr
    seen = json.loads(job.stdout)
    mine = slices["2g.20gb"][1]
    want = {f"nvidia{a100.minor}": "ENXIO"}
    for m in a100.mig_instances:
        verdict = "ENXIO" if m.gpu_instance_id == mine else "EPERM"
        want.update(
            {f"cap-gi{m.gpu_instance_id}": verdict, f"cap-gi{m.gpu_instance_id}-ci0": verdict}
        )
    assert seen == want
    # Outside the job every node opens as far as the kernel goes (no driver: ENXIO).
    free = subprocess.run([sys.executable, str(tmp_path / "probe.py"), str(dev)], env=env,
                          capture_output=True, text=True, check=True)  # fmt: skip
    assert set(json.loads(free.stdout).values()) == {"ENXIO"}
