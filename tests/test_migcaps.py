"""Fencing per MIG slice: a job on one slice opens only that slice's capability nodes.

The numbers come from the driver's files (gpuwarden.cgroups.migcaps), which the simulator
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
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from components import require
from gpuwarden.cgroups import devices, hierarchy, migcaps
from gpuwarden.machine.inventory import Gpu, read_snapshot
from gpuwarden.sim import driverfiles
from repo import SRC
from servicetools import USER_PY, Server, cli_as, serving
from users import make_user

FREE_1G = "MIG-a519e028-12b6-5f0e-b6eb-f2727e12e20a"  # mixed's 1g.10gb nobody uses

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
    assert migcaps.denied(caps, [(1, 2, 0)]) == (84,)
    assert migcaps.denied(caps, []) == (21, 22, 84)
    assert devices.device_rules([0], [0, 1], (237, (21, 84))) == [
        "c 195:1 rwm",
        "c 237:21 rwm",
        "c 237:84 rwm",
    ]
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


def _nodes(where: Path) -> tuple[Path, Gpu, migcaps.Caps]:
    """Stand-in nodes in `where`/dev for the simulated machine's A100 (GPU 3) and every
    MIG instance's caps node, numbered from the simulator's driver files."""
    caps = migcaps.read(migcaps.driver_root())
    assert caps is not None
    a100 = read_snapshot().gpus[3]
    dev = where / "dev"
    dev.mkdir(mode=0o755)
    assert a100.minor is not None
    os.mknod(dev / f"nvidia{a100.minor}", 0o666 | 0o020000, os.makedev(195, a100.minor))
    for (_gpu, gi, ci), minor in caps.minors.items():
        name = f"cap-gi{gi}" + ("" if ci is None else f"-ci{ci}")
        os.mknod(dev / name, 0o666 | 0o020000, os.makedev(caps.major, minor))
    for node in dev.iterdir():
        node.chmod(0o666)  # past the umask: only the cgroup may deny
    return dev, a100, caps


def _verdicts(a100: Gpu, mine: Any) -> dict[str, str]:
    """What a job on GPU instance `mine` of `a100` sees: its GPU and its own caps nodes
    open as far as the kernel goes (ENXIO: no driver), the other slices' are denied."""
    want = {f"nvidia{a100.minor}": "ENXIO"}
    for m in a100.mig_instances:
        verdict = "ENXIO" if m.gpu_instance_id == mine else "EPERM"
        want.update(
            {f"cap-gi{m.gpu_instance_id}": verdict, f"cap-gi{m.gpu_instance_id}-ci0": verdict}
        )
    return want


def test_a_job_on_one_slice_is_denied_the_other_slices_caps(
    tmp_path: Path, sim: Any, cli: Any
) -> None:
    mode, why = hierarchy.detect()
    require(mode == "cgroup-v1", f"no device isolation here ({why})")
    sim("mixed")
    dev, a100, _ = _nodes(tmp_path)
    (tmp_path / "probe.py").write_text(PROBE)
    env = {"PYTHONPATH": str(SRC)}
    job = cli("run", "--mig", "2g.20gb", "--", sys.executable, str(tmp_path / "probe.py"), str(dev))
    assert job.returncode == 0, job.stderr
    mine = next(m.gpu_instance_id for m in a100.mig_instances if m.name == "2g.20gb")
    assert json.loads(job.stdout) == _verdicts(a100, mine)
    # Outside the job every node opens as far as the kernel goes (no driver: ENXIO).
    free = subprocess.run([sys.executable, str(tmp_path / "probe.py"), str(dev)], env=env,
                          capture_output=True, text=True, check=True)  # fmt: skip
    assert set(json.loads(free.stdout).values()) == {"ENXIO"}


@pytest.fixture
def mixed_service(
    tmp_path: Path, open_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Server]:
    """The real queue service (tests/servicetools.py) on `mixed`."""
    yield from serving(tmp_path, open_dir, monkeypatch, spec="mixed")


def test_a_service_job_on_one_slice_is_denied_the_other_slices_caps(
    mixed_service: Server, open_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    mode, why = hierarchy.detect()
    require(mode == "cgroup-v1", f"no device isolation here ({why})")
    monkeypatch.setenv("GPUWARDEN_SIM", "mixed")
    dev, a100, _ = _nodes(open_dir)
    probe = open_dir / "probe.py"
    probe.write_text(PROBE)
    probe.chmod(0o644)
    alice = make_user("alice", ("lab",))
    sub = cli_as(
        mixed_service, alice, "submit", "--mig", "1g.10gb", "--",
        USER_PY, str(probe), str(dev),
    )  # fmt: skip
    assert sub.returncode == 0, sub.stderr
    job = int(sub.stdout.strip())
    assert mixed_service.wait_state(job, ("COMPLETED", "FAILED"))["state"] == "COMPLETED"
    seen = json.loads((mixed_service.work / f"gpuwarden-{job}.out").read_text())
    mine = next(m.gpu_instance_id for m in a100.mig_instances if m.uuid == FREE_1G)
    assert seen == _verdicts(a100, mine)
