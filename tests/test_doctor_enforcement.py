"""The doctor says which device isolation `gpuwarden run` gets, and why."""

from __future__ import annotations

import json

import pytest

from gpuwarden.doctor.checks.enforcement import check_enforcement
from gpuwarden.doctor.facts import Facts
from gpuwarden.doctor.findings import INFO, PASS, WARN
from gpuwarden.machine.inventory import Gpu, Snapshot

SNAP = Snapshot(taken_at=0.0, hostname="h", gpus=(Gpu(index=0, uuid="GPU-0", minor=0),))


@pytest.mark.parametrize(
    "enforcement, shared, level, words",
    [
        (("cgroup-v1", "cgroup v1 devices controller at /x"), False, PASS, "cgroup-v1"),
        (("none", "not root: only root can create device cgroups"), False, INFO, "no device"),
        (("none", "cgroup v2 only: ... BPF_PROG_TYPE_CGROUP_DEVICE"), True, WARN, "is shared"),
        (("none", "enforce.devices = off"), False, INFO, "no device"),
    ],
)
def test_finding_per_mode(enforcement, shared, level, words) -> None:
    found = check_enforcement(
        Facts(snapshot=SNAP, enforcement=enforcement, lease_dir_shared=shared)
    )
    assert [(f.check, f.level) for f in found] == [("enforcement", level)]
    assert words in found[0].title and found[0].saw == enforcement[1]


def test_no_gpu_or_no_fact_no_finding() -> None:
    assert check_enforcement(Facts(snapshot=SNAP)) == []
    empty = Snapshot(taken_at=0.0, hostname="h")
    assert check_enforcement(Facts(snapshot=empty, enforcement=("none", "x"))) == []


def test_doctor_reports_it(cli, sim) -> None:
    sim("server-8xa100")
    out = cli("doctor", "--json", env={"GPUWARDEN_ENFORCE_DEVICES": "off"})
    found = [f for f in json.loads(out.stdout)["findings"] if f["check"] == "enforcement"]
    assert len(found) == 1 and found[0]["saw"] == "enforce.devices = off", out.stdout
