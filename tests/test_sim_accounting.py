"""The driver's accounting mode on the simulated machine (gpuwarden.sim.accounting), as
nvidia-ml-py's callers read it: off by default, root's to turn on, a record per process
started after, with its peak memory kept once the process has ended."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from gpuwarden.machine.inventory import load_nvml, read_snapshot
from gpuwarden.machine.processuse import read_memory_peaks
from gpuwarden.sim import Machine


def test_accounting_records_each_process_and_its_peak_memory(sim) -> None:  # type: ignore[no-untyped-def]
    sim("server-8xa100")
    machine = Machine.open()
    nv = load_nvml()
    nv.nvmlInit()
    handle = nv.nvmlDeviceGetHandleByIndex(0)
    uuid = read_snapshot().gpus[0].uuid
    before = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    worker = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        machine.add_process(0, before.pid, "1GiB")
        # off by default, as the driver ships: nothing to read
        assert nv.nvmlDeviceGetAccountingMode(handle) == nv.NVML_FEATURE_DISABLED
        with pytest.raises(nv.NVMLError_NotSupported):
            nv.nvmlDeviceGetAccountingPids(handle)
        assert read_memory_peaks(nv, {uuid: [before.pid]}) == {}
        if os.geteuid() != 0:
            with pytest.raises(nv.NVMLError_NoPermission):
                nv.nvmlDeviceSetAccountingMode(handle, nv.NVML_FEATURE_ENABLED)
            pytest.skip("turning accounting on is root's")
        nv.nvmlDeviceSetAccountingMode(handle, nv.NVML_FEATURE_ENABLED)
        assert nv.nvmlDeviceGetAccountingMode(handle) == nv.NVML_FEATURE_ENABLED
        assert nv.nvmlDeviceGetAccountingBufferSize(handle) == 4000
        # a process that grows to 6 GiB, then frees most of it
        for size, util in (("2GiB", 40), ("6GiB", 70), ("1GiB", 20)):
            machine.add_process(0, worker.pid, size, util=util)
        assert nv.nvmlDeviceGetAccountingPids(handle) == [worker.pid]  # not the earlier one
        stats = nv.nvmlDeviceGetAccountingStats(handle, worker.pid)
        assert stats.maxMemoryUsage == 6 << 30 and stats.isRunning == 1
        assert stats.gpuUtilization == 20
        with pytest.raises(nv.NVMLError_NotFound):
            nv.nvmlDeviceGetAccountingStats(handle, before.pid)
        assert read_memory_peaks(nv, {uuid: [worker.pid, before.pid]}) == {
            uuid: {worker.pid: 6 << 30}
        }
        # it exits: its record stays, ended, with its peak
        worker.kill()
        worker.wait()
        machine.remove_process(before.pid)  # any write of the state
        stats = nv.nvmlDeviceGetAccountingStats(handle, worker.pid)
        assert stats.isRunning == 0 and stats.maxMemoryUsage == 6 << 30 and stats.time >= 0
        nv.nvmlDeviceClearAccountingPids(handle)
        assert nv.nvmlDeviceGetAccountingPids(handle) == []
        nv.nvmlDeviceSetAccountingMode(handle, nv.NVML_FEATURE_DISABLED)
        with pytest.raises(nv.NVMLError_NotSupported):
            nv.nvmlDeviceGetAccountingStats(handle, worker.pid)
        other = nv.nvmlDeviceGetHandleByIndex(1)
        assert nv.nvmlDeviceGetAccountingMode(other) == nv.NVML_FEATURE_DISABLED  # per GPU
    finally:
        for proc in (before, worker):
            proc.kill()
            proc.wait()
        nv.nvmlShutdown()
