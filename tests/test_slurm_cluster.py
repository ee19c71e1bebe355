"""`gpuwarden slurm cluster`'s files from nodes' facts (pure): what each file holds, and
facts from another machine that must not become configuration lines. The cluster they
make really runs in tests/test_slurm_cluster_real.py."""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import Any

import pytest

from gpuwarden.base.errors import UserError
from gpuwarden.slurm import cluster
from schemas import validate


def facts(cli: Any, spec: str, node: str, address: str) -> dict[str, Any]:
    env = {"GPUWARDEN_SIM": spec, "SSH_CONNECTION": f"10.9.0.1 50000 {address} 22"}
    done = cli("slurm", "conf", "--json", env=env)
    assert done.returncode == 0, done.stderr
    validate("slurm", done.stdout)
    return {**json.loads(done.stdout), "node": node}


def options(**given: Any) -> argparse.Namespace:
    base = dict(
        controller="head=10.9.0.1",
        name="lab",
        state_dir=None,
        conf_dir="/etc/slurm",
        slurm_user="slurm",
        port=6817,
        hook_env="/etc/default/gpuwarden",
        slurmdbd=None,
        no_slurmdbd=False,
        cgroup="autodetect",
    )
    return argparse.Namespace(**{**base, **given})


def test_every_setting_has_its_reason_and_each_node_its_own_gpus(cli: Any) -> None:
    mig = facts(cli, "mixed", "gpu1", "10.9.0.7")
    plain = facts(cli, "workstation-3x3090", "gpu2", "10.9.0.8")
    nodes, problems = cluster.nodes_of([("a", mig, ""), ("b", plain, "")])
    assert problems == []
    files = cluster.files(nodes, cluster.ClusterSettings.parse(options()), now=0)
    assert sorted(files) == sorted(
        [
            "slurm.conf",
            "gres.conf",
            "cgroup.conf",
            "prolog.sh",
            "epilog.sh",
            "task-prolog.sh",
            "README",
            "slurmdbd.conf",
        ]
    )
    for name in ("slurm.conf", "gres.conf", "cgroup.conf", "slurmdbd.conf"):
        lines = files[name].splitlines()
        for i, line in enumerate(lines):
            if line and not line.startswith("#"):
                assert lines[i - 1].startswith("#") or "=" in lines[i - 1], (name, line)
    conf = files["slurm.conf"].splitlines()
    assert "SlurmctldHost=head(10.9.0.1)" in conf
    assert "PriorityType=priority/multifactor" in conf
    assert "AccountingStorageHost=head" in conf
    assert "AccountingStoragePort=6819" in conf  # slurmdbd's, two past slurmctld's
    assert "AccountingStorageTRES=gres/gpu" in conf  # GPU hours in sacct, sreport, fair share
    assert conf[-1].endswith(" TRESBillingWeights=CPU=0.1,GRES/gpu=1.0")
    dbd = files["slurmdbd.conf"].splitlines()
    assert "DbdPort=6819" in dbd and "StorageHost=localhost" in dbd
    node1 = next(x for x in conf if x.startswith("NodeName=gpu1 "))
    assert "NodeAddr=10.9.0.7" in node1 and "gpu:a100_1g.10gb:2" in node1
    gres = files["gres.conf"].splitlines()
    assert sum(x.startswith("NodeName=gpu1 ") and "MultipleFiles=" in x for x in gres) == 4
    assert [x for x in gres if x.startswith("NodeName=gpu2 ")] == [
        f"NodeName=gpu2 Name=gpu File=/dev/nvidia{i}" for i in range(3)
    ]
    assert "ConstrainDevices=yes" in files["cgroup.conf"].splitlines()
    assert "TaskProlog=/etc/slurm/task-prolog.sh" in conf
    assert files["task-prolog.sh"].endswith('exec "$python" -m gpuwarden slurm task-prolog\n')
    without = cluster.files(nodes, cluster.ClusterSettings.parse(options(no_slurmdbd=True)))
    assert "slurmdbd.conf" not in without
    assert "PriorityType=priority/basic" in without["slurm.conf"].splitlines()
    assert "AccountingStorageType=accounting_storage/none" in without["slurm.conf"]


def test_facts_that_would_smuggle_configuration_are_refused(cli: Any) -> None:
    good = facts(cli, "workstation-3x3090", "gpu1", "10.9.0.7")
    bad = {
        "newline": {**good, "gres_lines": ["Name=gpu File=/dev/nvidia0\nSlurmUser=root"]},
        "name": {**good, "node": "gpu1 SlurmUser=root"},
        "gres": {**good, "gres": "gpu:2 SlurmUser=root"},
        "python": {**good, "python": "/usr/bin/python3; rm -rf /"},
        "cpus": {**good, "cpus": True},
        "old": {k: v for k, v in good.items() if k != "gres_lines"},
    }
    nodes, problems = cluster.nodes_of(
        [
            ("ok", good, ""),
            *((k, v, "") for k, v in bad.items()),
            ("twin", good, ""),
            ("down", None, "ssh: refused"),
        ]
    )
    assert [n.name for n in nodes] == ["gpu1"]
    assert [p.split(":")[0] for p in problems] == [*bad, "twin", "down"]
    assert problems[-3] == "old: its `slurm conf --json` has no 'gres_lines' (an older gpuwarden?)"


def test_options_are_checked_and_an_earlier_directory_is_never_overwritten(
    tmp_path: Path,
) -> None:
    for given in (
        {"controller": "head=10.9.0.1 x"},
        {"state_dir": "relative/dir"},
        {"hook_env": "/etc/x y"},
        {"port": 65535},
        {"slurmdbd": "db", "no_slurmdbd": True},
    ):
        with pytest.raises(UserError):
            cluster.ClusterSettings.parse(options(**given))
    target = tmp_path / "conf"
    cluster.write(str(target), {"prolog.sh": "#!/bin/sh\n", "slurm.conf": "X=1\n"})
    assert os.stat(target / "prolog.sh").st_mode & 0o777 == 0o755
    with pytest.raises(UserError, match="is not empty"):
        cluster.write(str(target), {"slurm.conf": "Y=2\n"})
    assert (target / "slurm.conf").read_text() == "X=1\n"
