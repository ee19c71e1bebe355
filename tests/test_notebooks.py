"""Jupyter kernels under a lease, with the real jupyter_client and ipykernel: a kernel
started by `KernelManager` from the kernelspec `gpuwarden kernel install` writes holds a
lease in its own process, sees exactly its GPU, keeps it across a restart, and frees it
when shut down and when killed."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest

from conftest import require
from gpuwarden.leases import list_leases


def _jupyter() -> bool:
    import importlib.util

    return all(importlib.util.find_spec(m) for m in ("jupyter_client", "ipykernel"))


@pytest.fixture
def kernels(tmp_path: Path, sim, cli, monkeypatch: pytest.MonkeyPatch) -> Path:
    require(_jupyter(), "jupyter_client and ipykernel (the test dependency group)")
    sim("server-8xa100")
    monkeypatch.setenv("JUPYTER_DATA_DIR", str(tmp_path / "jupyter"))
    monkeypatch.setenv("JUPYTER_RUNTIME_DIR", str(tmp_path / "runtime"))
    monkeypatch.setenv("JUPYTER_PLATFORM_DIRS", "1")
    done = cli("kernel", "install", "-g", "1", "--exclude", "0,1,2,3,4,5")
    assert done.returncode == 0, done.stderr
    assert "'Python (1 GPU)' as gpuwarden-1gpu" in done.stdout
    return tmp_path / "jupyter" / "kernels" / "gpuwarden-1gpu" / "kernel.json"


def _visible(km) -> str:  # type: ignore[no-untyped-def]
    kc = km.client()
    kc.start_channels()
    try:
        kc.wait_for_ready(timeout=60)
        out: list[str] = []

        def keep(msg) -> None:  # type: ignore[no-untyped-def]
            if msg["msg_type"] == "stream":
                out.append(msg["content"]["text"])

        code = "import os; print(os.environ['CUDA_VISIBLE_DEVICES'], os.environ['GPUWARDEN_JOB'])"
        kc.execute_interactive(code, output_hook=keep, timeout=60)
        return "".join(out).strip()
    finally:
        kc.stop_channels()


def _until(what: str, ok, seconds: float = 30):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + seconds
    while not (got := ok()):
        assert time.monotonic() < deadline, f"{what}: not within {seconds:g}s"
        time.sleep(0.05)
    return got


def test_a_kernel_leases_its_gpu_keeps_it_across_a_restart_and_frees_it(kernels: Path) -> None:
    from jupyter_client import KernelManager

    spec = json.loads(kernels.read_text())
    assert spec["metadata"]["kernel_provisioner"]["provisioner_name"] == "gpuwarden"
    km = KernelManager(kernel_name="gpuwarden-1gpu")
    km.start_kernel()
    try:
        pid = km.provisioner.pid
        [lease] = list_leases()
        assert lease.pid == pid  # the kernel is the lease's job
        visible, job = _visible(km).split()
        assert visible in ("6", "7") and job == lease.job and str(lease.index) == visible
        km.restart_kernel(now=True)
        assert km.provisioner.pid != pid
        [again] = list_leases()
        assert (again.job, again.uuid) == (lease.job, lease.uuid)  # the same lease, kept
        assert again.pid == km.provisioner.pid
        assert _visible(km).split() == [visible, job]
    finally:
        km.shutdown_kernel(now=True)
    assert list_leases() == []


def test_a_killed_kernel_frees_its_gpu(kernels: Path) -> None:
    from jupyter_client import KernelManager

    km = KernelManager(kernel_name="gpuwarden-1gpu")
    km.start_kernel()
    try:
        [lease] = list_leases()
        os.kill(km.provisioner.pid, signal.SIGKILL)
        _until("the lease is freed", lambda: list_leases() == [])
        assert lease.pid == km.provisioner.pid
    finally:
        km.shutdown_kernel(now=True)


def test_a_kernel_that_finds_no_gpu_does_not_start(kernels: Path, cli) -> None:
    from jupyter_client import KernelManager

    from gpuwarden.errors import UserError

    kms = [KernelManager(kernel_name="gpuwarden-1gpu") for _ in range(3)]
    kms[0].start_kernel()
    kms[1].start_kernel()
    try:
        with pytest.raises(UserError, match="GPU"):
            kms[2].start_kernel()
        assert len(list_leases()) == 2
    finally:
        for km in kms[:2]:
            km.shutdown_kernel(now=True)
    assert list_leases() == []


def test_with_a_queue_service_a_kernel_says_to_start_jupyter_as_a_job(
    kernels: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import socket

    from jupyter_client import KernelManager

    from gpuwarden.errors import UserError

    path = tmp_path / "service.sock"  # something answers there: a service runs
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(str(path))
    monkeypatch.setenv("GPUWARDEN_SOCKET", str(path))
    km = KernelManager(kernel_name="gpuwarden-1gpu")
    try:
        with pytest.raises(UserError, match="gpuwarden run -g N -- jupyter lab"):
            km.start_kernel()
    finally:
        listener.close()
    assert list_leases() == []
