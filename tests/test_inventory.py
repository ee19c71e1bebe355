"""read_snapshot turns NVML answers into a Snapshot: None for what a card cannot say."""

from __future__ import annotations

import dataclasses
import os

from gpuwarden.machine.inventory import NO_DRIVER, read_snapshot
from gpuwarden.sim import Machine
from gpuwarden.sim.fake import module


def test_server_snapshot(sim):
    sim("server-8xa100")
    snap = read_snapshot(topology=True)
    assert snap.source == "sim:server-8xa100"
    assert snap.driver_version == "550.54.15" and snap.cuda_driver_version == (12, 4)
    assert [g.index for g in snap.gpus] == list(range(8))
    g0 = snap.gpus[0]
    assert g0.compute_capability == (8, 0) and g0.power_limit == 400.0
    assert g0.fan_speed is None  # SXM: NotSupported -> None
    assert g0.memory_total == g0.memory_used + g0.memory_free + 527 * 2**20
    assert [(p.user, p.used_memory) for p in g0.processes] == [("alice", 71 * 2**30)]
    assert snap.gpus[6].remapped_rows_pending is True
    assert snap.gpus[6].retired_pages_pending is None  # Ampere has no page retirement
    assert snap.gpus[3].throttle_reasons == ("sw_power_cap",)
    assert snap.nvlinks[(0, 7)] == 12  # NVSwitch: every pair
    assert snap.topology[(0, 1)] == 10 and snap.topology[(0, 7)] == 50


def test_consumer_card_fields_are_none(sim):
    sim("workstation-3x3090")
    g = read_snapshot().gpus[0]
    assert g.ecc_mode is None and g.mig_mode is None and g.remapped_rows_pending is None
    assert g.fan_speed == 30 and g.compute_capability == (8, 6)


def test_mixed_machine(sim):
    sim("mixed")
    snap = read_snapshot()
    assert [g.name for g in snap.gpus] == [
        "Tesla T4",
        "Tesla V100-SXM2-32GB",
        "NVIDIA RTX A6000",
        "NVIDIA A100-SXM4-80GB",
    ]
    assert snap.gpus[1].ecc_uncorrected_volatile == 2
    a100 = snap.gpus[3]
    assert a100.mig_mode is True and a100.utilization_gpu is None
    assert [m.name for m in a100.mig_instances] == ["3g.40gb", "2g.20gb", "1g.10gb", "1g.10gb"]
    owners = {p.user: p.mig_uuid for p in a100.processes}
    assert owners["grace"] == a100.mig_instances[0].uuid
    assert owners["heidi"] == a100.mig_instances[2].uuid


def test_lost_gpu_is_marked_and_others_still_read(sim):
    sim("server-8xa100")
    Machine.open().lose(4)
    snap = read_snapshot()
    lost = snap.gpus[4]
    assert lost.lost and lost.uuid.startswith("GPU-") and lost.memory_used is None
    assert "lost" in (lost.error or "").lower()
    assert all(not g.lost and g.memory_total for g in snap.gpus if g.index != 4)


def test_no_driver_is_an_empty_snapshot_with_the_reason(sim):
    sim("laptop-none")
    snap = read_snapshot()
    assert snap.gpus == () and snap.error == NO_DRIVER


def test_real_process_gets_user_and_command_from_psutil(sim):
    import getpass
    import os

    sim("server-8xa100")
    Machine.open().add_process(7, os.getpid(), "1GiB")  # no user/command given
    proc = read_snapshot().gpus[7].processes[0]
    assert proc.pid == os.getpid() and proc.user == getpass.getuser()
    assert "pytest" in (proc.command or "") or "python" in (proc.command or "")


def test_explicit_module_and_processes_off():
    snap = read_snapshot(module("server-8xa100"), processes=False)
    assert all(g.processes == () for g in snap.gpus)


class _OldDriver:
    """The simulated library as an older driver and binding see it: one function the
    driver lacks (FunctionNotFound), one the binding lacks (no attribute)."""

    def __init__(self, nv):
        self._nv = nv

    def __getattr__(self, name):
        if name == "nvmlDeviceGetPowerUsage":

            def lacking(*args):
                raise self._nv.NVMLError(self._nv.NVML_ERROR_FUNCTION_NOT_FOUND)

            return lacking
        if name == "nvmlDeviceGetTemperature":
            raise AttributeError(name)
        return getattr(self._nv, name)


def test_a_missing_nvml_function_is_logged_once_and_reads_none(sim, caplog):
    from gpuwarden.machine import inventory

    sim("server-8xa100")
    inventory._MISSING.clear()
    old = _OldDriver(module())
    with caplog.at_level("WARNING", logger="gpuwarden.machine.inventory"):
        first = read_snapshot(old, processes=False)
        read_snapshot(old, processes=False)
    assert len(first.gpus) == 8
    assert all(g.power_draw is None and g.temperature is None for g in first.gpus)
    assert first.gpus[0].memory_total is not None  # the rest is still read
    lines = [r.getMessage() for r in caplog.records if r.name == "gpuwarden.machine.inventory"]
    assert len(lines) == 2, lines  # once per function, not per GPU or per reading
    assert any("nvmlDeviceGetPowerUsage" in t and "driver" in t for t in lines)
    assert any("nvmlDeviceGetTemperature" in t and "binding" in t for t in lines)
    inventory._MISSING.clear()


def test_reading_for_a_choice_skips_only_what_no_choice_uses(sim):
    sim("mixed")
    full, lean = read_snapshot(), read_snapshot(detail=False)
    shown_only = (
        "temperature",
        "power_draw",
        "power_limit",
        "energy_consumed",
        "fan_speed",
        "clock_sm",
        "clock_sm_max",
        "persistence_mode",
        "compute_mode",
    )
    assert any(g.temperature is not None for g in full.gpus)
    for a, b in zip(full.gpus, lean.gpus):
        assert all(getattr(b, name) is None for name in shown_only)
        # Everything else (health, memory, processes, MIG) is read as fully as before.
        assert dataclasses.replace(a, **dict.fromkeys(shown_only)) == b


def test_each_process_on_a_shared_gpu_has_its_own_utilisation(sim):
    """NVML's per-process samples (pynvml's nvmlDeviceGetProcessUtilization, as nvitop
    reads them): each added process its own load, the spec's process the rest."""
    import subprocess
    import sys

    from gpuwarden.machine.inventory import load_nvml
    from gpuwarden.machine.processuse import read_process_use

    sim("server-8xa100")
    machine = Machine.open()
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        machine.add_process(0, os.getpid(), "1GiB", util=30)
        machine.add_process(0, other.pid, "1GiB", util=10)
        nv = load_nvml()
        nv.nvmlInit()
        handle = nv.nvmlDeviceGetHandleByIndex(0)
        total = nv.nvmlDeviceGetUtilizationRates(handle).gpu
        samples = {s.pid: s.smUtil for s in nv.nvmlDeviceGetProcessUtilization(handle, 0)}
        assert samples[os.getpid()] == 30 and samples[other.pid] == 10, samples
        assert sum(samples.values()) == total  # together they are the GPU's
        uuid = read_snapshot().gpus[0].uuid
        got = read_process_use(nv, [uuid, "GPU-nothing-here"], 0)
        assert set(got) == {uuid}  # a GPU NVML does not know is left out
        assert got[uuid][other.pid].sm == 10.0 and got[uuid][other.pid].samples == 1
        idle = next(g.uuid for g in read_snapshot().gpus if not g.processes)
        assert read_process_use(nv, [idle], 0) == {idle: {}}  # no process ran there
        nv.nvmlShutdown()
    finally:
        other.kill()
        other.wait()
