"""The doctor says where containers can use GPUs without a lease (docs/containers.md)."""

from __future__ import annotations

from pathlib import Path

from gpuwarden.doctor.checks.containers import check_containers
from gpuwarden.doctor.facts import Facts, read_containers
from gpuwarden.doctor.findings import INFO, PASS, WARN
from gpuwarden.machine.inventory import Gpu, Snapshot

SNAP = Snapshot(taken_at=0.0, hostname="h", gpus=(Gpu(index=0, uuid="GPU-0", minor=0),))


def _check(**seen: object) -> list[tuple[str, str]]:
    facts = Facts(snapshot=SNAP, containers={"runtimes": ["docker"], "toolkit": "T", **seen})
    return [(f.level, f.title) for f in check_containers(facts)]


def test_docker_group_members_envvar_and_missing_cdi_are_named() -> None:
    found = _check(docker_group=["alice", "bob"], toolkit_envvar=True, cdi=None)
    assert [level for level, _ in found] == [WARN, WARN, INFO]
    assert "alice, bob" in found[0][1]
    assert "NVIDIA_VISIBLE_DEVICES=all" in found[1][1]
    assert _check(docker_group=[], toolkit_envvar=False, cdi="/etc/cdi/nvidia.yaml") == [
        (PASS, "CDI spec /etc/cdi/nvidia.yaml: containers get their GPUs by UUID")
    ]


def test_no_runtime_or_no_gpu_no_finding() -> None:
    assert check_containers(Facts(snapshot=SNAP, containers={"runtimes": []})) == []
    assert check_containers(Facts(snapshot=SNAP)) == []
    empty = Snapshot(taken_at=0.0, hostname="h")
    assert check_containers(Facts(snapshot=empty, containers={"runtimes": ["podman"]})) == []


def test_the_toolkit_setting_is_read_with_its_default(tmp_path: Path) -> None:
    conf = tmp_path / "config.toml"
    assert read_containers(str(conf))["toolkit_envvar"] is None  # no toolkit
    conf.write_text("[nvidia-container-cli]\nldconfig = '@/sbin/ldconfig'\n")
    assert read_containers(str(conf))["toolkit_envvar"] is True  # absent: its default
    conf.write_text(
        "#accept-nvidia-visible-devices-envvar-when-unprivileged = true\n"
        "accept-nvidia-visible-devices-envvar-when-unprivileged = false # checked\n"
    )
    assert read_containers(str(conf))["toolkit_envvar"] is False
