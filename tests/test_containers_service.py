"""Containers through the queue service: `gpuwarden run` and `submit` hand the service a
container command, and the job it starts (gpuwarden.containers.runtime) passes exactly the GPUs
the service leased into the container, with the lease's descriptors (real podman as root,
stand-in /dev/nvidiaN nodes, the service on a simulated machine)."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from components import require
from gpuwarden.containers.runtime import lease_fds
from podmantools import IMAGE, PROBE, podman_ready
from repo import SRC
from servicetools import USER_PY, Server, serving
from waiting import wait_for


@pytest.fixture
def service(tmp_path: Path, open_dir: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Server]:
    """The queue service with a grace long enough for `podman stop` on a busy machine
    (the default is 30 s)."""
    yield from serving(tmp_path, open_dir, monkeypatch, "--grace", "20s")


@pytest.fixture
def dev(tmp_path: Path) -> Path:
    require(podman_ready(), f"podman (as root) with the image {IMAGE}: run scripts/containers-ci")
    where = tmp_path / "dev"
    where.mkdir()
    for minor in range(4):
        os.mknod(where / f"nvidia{minor}", 0o666 | 0o020000, os.makedev(195, minor))
    return where


def _gpuwarden(srv: Server, dev: Path, *args: str) -> subprocess.CompletedProcess[str]:
    from hermetic import hermetic

    env = {
        **hermetic(),  # never the machine's own config
        "PYTHONPATH": str(SRC),
        "PATH": "/usr/sbin:/usr/bin:/sbin:/bin",
        "GPUWARDEN_SOCKET": srv.socket,
        "GPUWARDEN_DEV_DIR": str(dev),
    }
    return subprocess.run(
        [USER_PY, "-m", "gpuwarden", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        cwd=str(srv.work),
    )


def test_run_through_the_service_passes_the_services_gpu_in(service: Server, dev: Path) -> None:
    argv = ["podman", "run", "--rm", "--network=none", IMAGE, "sh", "-c", PROBE]
    ran = _gpuwarden(service, dev, "run", "--gpus", "2", "--", *argv)
    assert ran.returncode == 7, ran.stderr  # the container's exit status
    assert [w for w in ran.stdout.split() if w.startswith("nvidia")] == ["nvidia2"]
    assert "nvidia2 No such device or address" in ran.stdout  # it may open it


def test_a_service_job_lasts_as_long_as_its_container(service: Server, dev: Path) -> None:
    """The service holds a job's GPUs until the job ends (its supervisor holds the
    leases): a container whose client is killed runs on, and so does its job."""
    flags = dev.parent / "flags"
    flags.mkdir()
    script = "touch /f/started; while [ ! -e /f/stop ]; do sleep 0.05; done"
    argv = ["podman", "run", "--rm", "-v", f"{flags}:/f", IMAGE, "sh", "-c", script]
    sub = _gpuwarden(service, dev, "submit", "-g", "1", "--", *argv)
    assert sub.returncode == 0, sub.stderr
    job = int(sub.stdout.strip())
    service.wait_state(job, ("RUNNING",))
    wait_for((flags / "started").exists, 60, lambda: f"the container to start: {service.job(job)}")
    try:
        _kill_the_client_and_see_the_job_run_on(service, job)
    finally:
        (flags / "stop").touch()
    row = service.wait_state(job, ("COMPLETED", "FAILED", "CANCELLED"), timeout=60)
    assert row["state"] != "RUNNING"


def _kill_the_client_and_see_the_job_run_on(service: Server, job: int) -> None:
    client = subprocess.run(
        ["pgrep", "-f", f"podman run .*--name=gpuwarden-{job}-"], capture_output=True, text=True
    ).stdout.split()
    assert client, "the container's client"
    for pid in client:
        os.kill(int(pid), signal.SIGKILL)
    time.sleep(1.0)  # long enough for a job that ended with its client to be seen so
    assert service.job(job)["state"] == "RUNNING", service.job(job)


def test_a_submitted_container_is_cancelled_with_a_stop(service: Server, dev: Path) -> None:
    flags = dev.parent / "flags"
    flags.mkdir()
    script = 'trap "exit 9" TERM; touch /f/started; while :; do sleep 0.05; done'
    sub = _gpuwarden(
        service,
        dev,
        "submit",
        "-g",
        "1",
        "--",
        "podman",
        "run",
        "--rm",
        "-v",
        f"{flags}:/f",
        IMAGE,
        "sh",
        "-c",
        script,
    )
    assert sub.returncode == 0, sub.stderr
    job = int(sub.stdout.strip())
    service.wait_state(job, ("RUNNING",))
    wait_for((flags / "started").exists, 60, lambda: f"the container to start: {service.job(job)}")
    running = subprocess.run(  # this job's container: job ids start at 1 in every
        # service, so another test's service may run a gpuwarden-1-… too; ours mounts `flags`
        ["podman", "ps", "--filter", f"volume={flags}", "--format", "{{.Names}}"],
        capture_output=True,
        text=True,
    ).stdout.split()
    [mine] = [n for n in running if n.startswith(f"gpuwarden-{job}-")]
    assert _gpuwarden(service, dev, "cancel", str(job)).returncode == 0
    row = service.wait_state(job, ("CANCELLED", "FAILED", "DONE"), timeout=60)
    assert row["state"] == "CANCELLED", row

    def names() -> list[str]:
        return subprocess.run(
            ["podman", "ps", "-a", "--format", "{{.Names}}"], capture_output=True, text=True
        ).stdout.split()

    out = service.work / f"gpuwarden-{job}.out"
    wait_for(  # and the container is gone: stopped, and removed (--rm)
        lambda: mine not in names(),
        30,
        lambda: f"{mine} gone: {(names(), out.exists() and out.read_text())}",
    )


def test_the_lease_descriptors_a_job_inherited_are_found_by_name(tmp_path: Path) -> None:
    names = ["GPU-a.lock", "GPU-a.7-1.lease", "GPU-b.lock", "GPU-a.8-1.lease", "other"]
    fds = {}
    for name in names:
        fds[name] = os.open(tmp_path / name, os.O_RDONLY | os.O_CREAT)
    try:
        found = lease_fds(["GPU-a"], "7-1")
        assert found == sorted([fds["GPU-a.lock"], fds["GPU-a.7-1.lease"]])
    finally:
        for fd in fds.values():
            os.close(fd)
