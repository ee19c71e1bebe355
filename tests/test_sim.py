"""The fake pynvml behaves like nvidia-ml-py on a real driver, and its state is shared."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest

from gpuwarden.base.errors import UserError
from gpuwarden.sim import Machine, specparse, specs
from gpuwarden.sim.fake import SHIM_DIR, module

SRC = Path(__file__).resolve().parent.parent / "src"


@pytest.fixture
def nv():
    mod = module("server-8xa100")
    mod.nvmlInit()
    yield mod
    while mod.gpuwarden_sim_library.refs:
        mod.nvmlShutdown()


def test_calls_before_init_raise_uninitialized():
    mod = module("workstation-3x3090")
    with pytest.raises(mod.NVMLError_Uninitialized):
        mod.nvmlDeviceGetCount()
    mod.nvmlInit()
    assert mod.nvmlDeviceGetCount() == 3
    mod.nvmlShutdown()
    with pytest.raises(mod.NVMLError_Uninitialized):
        mod.nvmlDeviceGetCount()


def test_real_error_classes_and_codes(nv):
    assert nv.NVMLError_NotSupported(0).value == nv.NVML_ERROR_NOT_SUPPORTED == 3
    handle = nv.nvmlDeviceGetHandleByIndex(0)
    with pytest.raises(nv.NVMLError_NotSupported):
        nv.nvmlDeviceGetFanSpeed(handle)  # SXM modules have no fan
    with pytest.raises(nv.NVMLError_InvalidArgument):
        nv.nvmlDeviceGetHandleByIndex(8)
    with pytest.raises(nv.NVMLError_NotFound):
        nv.nvmlDeviceGetHandleByUUID(b"GPU-00000000-0000-0000-0000-000000000000")


def test_a100_figures_are_the_real_ones(nv):
    h = nv.nvmlDeviceGetHandleByIndex(7)
    assert nv.nvmlDeviceGetName(h) == "NVIDIA A100-SXM4-80GB"
    mem = nv.nvmlDeviceGetMemoryInfo(h, version=nv.nvmlMemory_v2)
    assert mem.total == 81920 * 2**20
    assert mem.total == mem.reserved + mem.used + mem.free
    assert nv.nvmlDeviceGetEnforcedPowerLimit(h) == 400_000
    assert nv.nvmlDeviceGetCudaComputeCapability(h) == (8, 0)
    assert nv.nvmlDeviceGetMaxClockInfo(h, nv.NVML_CLOCK_SM) == 1410
    assert nv.nvmlSystemGetDriverVersion() == "550.54.15"
    assert nv.nvmlSystemGetCudaDriverVersion_v2() == 12040


def test_handles_by_uuid_and_pci_bus_id_agree(nv):
    h = nv.nvmlDeviceGetHandleByIndex(5)
    uuid = nv.nvmlDeviceGetUUID(h)
    bus = nv.nvmlDeviceGetPciInfo(h).busId
    assert nv.nvmlDeviceGetIndex(nv.nvmlDeviceGetHandleByUUID(uuid)) == 5
    assert nv.nvmlDeviceGetIndex(nv.nvmlDeviceGetHandleByPciBusId(bus)) == 5
    assert bus == "00000000:90:00.0"


def test_processes_v3_and_v1_structs(nv):
    h = nv.nvmlDeviceGetHandleByIndex(5)
    procs = nv.nvmlDeviceGetComputeRunningProcesses(h)
    assert sorted(p.usedGpuMemory for p in procs) == [2 * 2**30, 30 * 2**30]
    assert all(p.gpuInstanceId == 0xFFFFFFFF for p in procs)
    assert nv.nvmlDeviceGetComputeRunningProcesses(nv.nvmlDeviceGetHandleByIndex(7)) == []


def test_consumer_card_lacks_ecc_mig_and_remapping():
    mod = module("workstation-3x3090")
    mod.nvmlInit()
    h = mod.nvmlDeviceGetHandleByIndex(0)
    for call in (
        mod.nvmlDeviceGetEccMode,
        mod.nvmlDeviceGetMigMode,
        mod.nvmlDeviceGetRemappedRows,
        mod.nvmlDeviceGetSerial,
    ):
        with pytest.raises(mod.NVMLError_NotSupported):
            call(h)
    assert mod.nvmlDeviceGetFanSpeed(h) == 30
    mod.nvmlShutdown()


def test_mig_handles():
    mod = module("mixed")
    mod.nvmlInit()
    a100 = mod.nvmlDeviceGetHandleByIndex(3)
    assert mod.nvmlDeviceGetMigMode(a100) == [1, 1]
    assert mod.nvmlDeviceGetMaxMigDeviceCount(a100) == 7
    mig = mod.nvmlDeviceGetMigDeviceHandleByIndex(a100, 0)
    assert mod.nvmlDeviceIsMigDeviceHandle(mig)
    assert mod.nvmlDeviceGetUUID(mig).startswith("MIG-")
    assert mod.nvmlDeviceGetName(mig).endswith("MIG 3g.40gb")
    assert mod.nvmlDeviceGetMemoryInfo(mig).total == 40192 * 2**20
    parent = mod.nvmlDeviceGetDeviceHandleFromMigDeviceHandle(mig)
    assert mod.nvmlDeviceGetIndex(parent) == 3
    with pytest.raises(mod.NVMLError_NotFound):
        mod.nvmlDeviceGetMigDeviceHandleByIndex(a100, 5)
    with pytest.raises(mod.NVMLError_NotSupported):
        mod.nvmlDeviceGetUtilizationRates(a100)
    by_uuid = mod.nvmlDeviceGetHandleByUUID(mod.nvmlDeviceGetUUID(mig))
    assert mod.nvmlDeviceIsMigDeviceHandle(by_uuid)
    procs = mod.nvmlDeviceGetComputeRunningProcesses(mig)
    assert [p.gpuInstanceId for p in procs] == [1]
    mod.nvmlShutdown()


def test_no_driver_raises_library_not_found():
    mod = module("laptop-none")
    with pytest.raises(mod.NVMLError_LibraryNotFound):
        mod.nvmlInit()


def test_lost_gpu_answers_gpu_is_lost_but_keeps_identity(nv):
    Machine.open("server-8xa100").lose(2)
    h = nv.nvmlDeviceGetHandleByIndex(2)
    with pytest.raises(nv.NVMLError_GpuIsLost):
        nv.nvmlDeviceGetMemoryInfo(h)
    with pytest.raises(nv.NVMLError_GpuIsLost):
        nv.nvmlDeviceGetTemperature(h, nv.NVML_TEMPERATURE_GPU)
    assert nv.nvmlDeviceGetUUID(h).startswith("GPU-")
    assert nv.nvmlDeviceGetTemperature(nv.nvmlDeviceGetHandleByIndex(3), 0) == 64


def test_state_changes_are_seen_by_a_reader_already_running(nv):
    h = nv.nvmlDeviceGetHandleByIndex(7)
    before = nv.nvmlDeviceGetMemoryInfo(h, version=nv.nvmlMemory_v2).used
    machine = Machine.open("server-8xa100")
    machine.add_process(7, os.getpid(), "10GiB", user="me", command="pytest", util=50)
    after = nv.nvmlDeviceGetMemoryInfo(h, version=nv.nvmlMemory_v2).used
    assert after - before == 10 * 2**30
    assert nv.nvmlDeviceGetUtilizationRates(h).gpu == 50
    assert [p.pid for p in nv.nvmlDeviceGetComputeRunningProcesses(h)] == [os.getpid()]
    machine.set_gpu(7, temperature=80)
    assert nv.nvmlDeviceGetTemperature(h, 0) == 80
    machine.remove_process(os.getpid())
    assert nv.nvmlDeviceGetMemoryInfo(h, version=nv.nvmlMemory_v2).used == before
    machine.reset()
    assert nv.nvmlDeviceGetTemperature(h, 0) == 32


def test_dead_processes_disappear():
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    machine = Machine.open("server-8xa100")
    machine.add_process(7, child.pid, "1GiB")
    from gpuwarden.sim.state import live_processes

    assert child.pid not in [p["pid"] for p in live_processes(machine.state())]


def test_a_writer_gives_up_in_one_line_when_the_lock_stays_held(monkeypatch):
    """A stopped or stuck process holding the state's lock must not hang every
    simulator client: a writer waits `LOCK_PATIENCE`, then says where to look."""
    from gpuwarden.sim import state

    machine = Machine.open("server-8xa100")
    machine.set_gpu(0, temperature=40)  # the state file and its lock exist
    lock = machine.file.path + ".lock"
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import fcntl, os, sys, time\n"
            "fd = os.open(sys.argv[1], os.O_RDWR)\n"
            "fcntl.flock(fd, fcntl.LOCK_EX)\n"
            "print('held', flush=True)\n"
            "time.sleep(60)\n",
            lock,
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"
        monkeypatch.setattr(state, "LOCK_PATIENCE", 0.3)
        with pytest.raises(UserError, match=r"lock .* has been held by another process for 0.3 s"):
            machine.set_gpu(0, temperature=50)
    finally:
        holder.kill()
        holder.wait()
    machine.set_gpu(0, temperature=50)  # the holder gone, the lock is taken again
    assert machine.state()["gpus"][0]["temperature"] == 50


def test_allocation_beyond_free_memory_is_refused():
    machine = Machine.open("server-8xa100")
    with pytest.raises(UserError, match="free"):
        machine.add_process(0, os.getpid(), "20GiB")


def test_xid_is_delivered_through_event_set(nv):
    h = nv.nvmlDeviceGetHandleByIndex(4)
    events = nv.nvmlEventSetCreate()
    nv.nvmlDeviceRegisterEvents(h, nv.nvmlEventTypeXidCriticalError, events)
    with pytest.raises(nv.NVMLError_Timeout):
        nv.nvmlEventSetWait_v2(events, 50)
    machine = Machine.open("server-8xa100")
    machine.inject_xid(5, 48)  # another GPU: not registered here
    timer = threading.Timer(0.1, machine.inject_xid, (4, 63))
    timer.start()
    data = nv.nvmlEventSetWait_v2(events, 5000)
    timer.join()
    assert data.eventType == nv.nvmlEventTypeXidCriticalError
    assert data.eventData == 63
    assert nv.nvmlDeviceGetIndex(data.device) == 4
    nv.nvmlEventSetFree(events)


def test_throttle_ecc_and_remap_injection(nv):
    machine = Machine.open("server-8xa100")
    machine.set_throttle(7, ["hw_thermal", "sw_power_cap"])
    machine.set_ecc(7, uncorrected=3)
    machine.set_remapped_rows(7, failure=True)
    h = nv.nvmlDeviceGetHandleByIndex(7)
    assert nv.nvmlDeviceGetCurrentClocksThrottleReasons(h) == 0x40 | 0x4
    assert nv.nvmlDeviceGetTotalEccErrors(h, 1, 0) == 3
    assert nv.nvmlDeviceGetRemappedRows(h)[3] == 1
    with pytest.raises(UserError, match="unknown throttle reason"):
        machine.set_throttle(7, ["too_hot"])


def test_topology_and_nvlink(nv):
    a, b, c = (nv.nvmlDeviceGetHandleByIndex(i) for i in (0, 1, 7))
    assert nv.nvmlDeviceGetTopologyCommonAncestor(a, b) == nv.NVML_TOPOLOGY_SINGLE
    assert nv.nvmlDeviceGetTopologyCommonAncestor(a, c) == nv.NVML_TOPOLOGY_SYSTEM
    assert nv.nvmlDeviceGetNvLinkState(a, 11) == 1
    with pytest.raises(nv.NVMLError_NotSupported):
        nv.nvmlDeviceGetNvLinkState(a, 12)


def test_unknown_function_is_function_not_found(nv):
    with pytest.raises(nv.NVMLError_FunctionNotFound):
        nv._nvmlGetFunctionPointer("nvmlDeviceGetConfComputeMemSizeInfo")


def test_functions_loaded_on_first_need_are_where_the_library_says():
    """`abi.ELSEWHERE` is a literal (finding a function must import nothing): it names every
    function of the modules loaded on first need, and only those, each where it is."""
    import importlib

    from gpuwarden.sim import abi, library

    found = {}
    for home, cls in abi.MIXINS.items():
        mixin = getattr(importlib.import_module(f"gpuwarden.sim.{home}"), cls)
        found.update({n: home for n in vars(mixin) if n.startswith("nvml")})
    assert found == abi.ELSEWHERE
    assert not set(found) & {n for n in dir(library.FakeLibrary) if n.startswith("nvml")}
    for alias, target in abi.ALIASES.items():  # every alias reaches a function
        assert target in found or hasattr(library.FakeLibrary, target), alias


def test_functions_elsewhere_load_on_first_lookup_and_keep_the_guards(tmp_path):
    """A fresh process: the run path's calls import none of the lazily loaded modules;
    the first lookup of one of their functions (or an alias of one) does, and the
    function is still guarded (uninitialised, lost GPU) like any other."""
    code = textwrap.dedent(
        """
        import sys
        from gpuwarden.sim import Machine
        from gpuwarden.sim.fake import module
        lazy = ["sensors", "links", "events", "handles", "procinfo"]
        def loaded():
            return [m for m in lazy if f"gpuwarden.sim.{m}" in sys.modules]
        nv = module("server-8xa100")
        try:
            nv.nvmlDeviceGetPowerUsage(None)
        except nv.NVMLError_Uninitialized:
            print("uninitialised")
        nv.nvmlInit()
        h = nv.nvmlDeviceGetHandleByIndex(0)
        nv.nvmlDeviceGetMemoryInfo(h); nv.nvmlDeviceGetUUID(h)
        print(loaded())
        print(nv.nvmlDeviceGetPowerManagementLimit(h), loaded())
        print(nv.nvmlDeviceGetTopologyCommonAncestor(h, h), loaded())
        Machine.open("server-8xa100").lose(0)
        try:
            nv.nvmlDeviceGetTemperature(h, 0)
        except nv.NVMLError_GpuIsLost:
            print("lost")
        try:
            nv._nvmlGetFunctionPointer("nvmlDeviceGetNoSuchThing")
        except nv.NVMLError_FunctionNotFound:
            print("not found")
        """
    )
    env = dict(os.environ, PYTHONPATH=str(SRC), GPUWARDEN_SIM_STATE=str(tmp_path))
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert out.stdout.splitlines() == [
        "uninitialised",
        "[]",
        "400000 ['sensors']",
        "0 ['sensors', 'links']",
        "lost",
        "not found",
    ], out.stderr


def test_h200_spec():
    mod = module("h200")
    mod.nvmlInit()
    h = mod.nvmlDeviceGetHandleByIndex(0)
    assert mod.nvmlDeviceGetName(h) == "NVIDIA H200"
    assert mod.nvmlDeviceGetMemoryInfo(h).total == 143771 * 2**20
    assert mod.nvmlDeviceGetEnforcedPowerLimit(h) == 700_000
    assert mod.nvmlDeviceGetCudaComputeCapability(h) == (9, 0)
    mod.nvmlShutdown()


# --- specs -------------------------------------------------------------------------


def test_unknown_spec_lists_bundled():
    with pytest.raises(UserError) as err:
        specs.load("server-9000")
    assert "server-8xa100" in str(err.value) and "workstation-3x3090" in str(err.value)


def _write(tmp_path: Path, text: str) -> str:
    path = tmp_path / "my.toml"
    path.write_text(textwrap.dedent(text))
    return str(path)


def test_used_over_total_is_refused_with_file_line_and_field(tmp_path):
    path = _write(
        tmp_path,
        """\
        [[gpu]]
        model = "RTX-3090"
        [[gpu.process]]
        user = "x"
        memory = "30GiB"
        """,
    )
    with pytest.raises(UserError) as err:
        specs.load(path)
    message = str(err.value)
    assert f"{path}:5" in message and "gpu[0].process" in message and ">" in message
    assert "\n" not in message


def test_unknown_field_names_line(tmp_path):
    path = _write(tmp_path, '[[gpu]]\nmodel = "T4"\ntemprature = 40\n')
    with pytest.raises(UserError, match=r"my.toml:3: gpu\[0\].temprature: unknown field"):
        specs.load(path)


def test_malformed_toml(tmp_path):
    path = _write(tmp_path, "[[gpu]\n")
    with pytest.raises(UserError, match="malformed TOML"):
        specs.load(path)


def test_feature_the_card_lacks_is_refused(tmp_path):
    path = _write(tmp_path, '[[gpu]]\nmodel = "RTX-3090"\necc_uncorrected = 2\n')
    with pytest.raises(UserError, match="does not support ecc"):
        specs.load(path)


def test_every_bundled_spec_parses():
    for name in specs.bundled():
        spec = specs.load(name)
        assert spec.driver == (name != "laptop-none")


def test_parsed_spec_cache_equals_a_fresh_parse_and_follows_edits(tmp_path, monkeypatch):
    state = str(tmp_path / "state")
    real_parse = specparse.parse
    for name in specs.bundled():
        path = specs.spec_path(name)
        fresh = specparse.parse(Path(path).read_text(encoding="utf-8"), path)
        monkeypatch.setattr(specs, "_CACHE", {})
        assert specs.load(name, state) == fresh  # parsed, then written
        monkeypatch.setattr(specs, "_CACHE", {})
        monkeypatch.setattr(specparse, "parse", None)  # a parse now would fail
        assert specs.load(name, state) == fresh  # read back from the cache
        monkeypatch.setattr(specparse, "parse", real_parse)
    path = _write(tmp_path, '[[gpu]]\nmodel = "T4"\n')
    monkeypatch.setattr(specs, "_CACHE", {})
    assert specs.load(path, state).gpus[0]["model"] == "T4"
    Path(path).write_text('[[gpu]]\nmodel = "RTX-3090"\ntemperature = 61\n')
    monkeypatch.setattr(specs, "_CACHE", {})
    assert specs.load(path, state).gpus[0]["temperature"] == 61
    Path(path).write_text('[[gpu]]\nmodel = "T4"\ntemprature = 40\n')
    monkeypatch.setattr(specs, "_CACHE", {})
    with pytest.raises(UserError, match="temprature"):
        specs.load(path, state)


def test_parsed_spec_cache_follows_the_parsing_code(tmp_path, monkeypatch):
    """specs names specparse by path (importing it would put it on every client's
    start-up path); that path is the module's, and editing the file means a fresh parse."""
    assert os.path.samefile(specs._SPECPARSE, specparse.__file__)
    state = str(tmp_path / "state")
    code = tmp_path / "specparse.py"
    code.write_text("one\n")
    monkeypatch.setattr(specs, "_SPECPARSE", str(code))
    parses = []
    real_parse = specparse.parse
    monkeypatch.setattr(specparse, "parse", lambda *a: parses.append(1) or real_parse(*a))
    for edit in (None, None, "two\n"):
        if edit:
            code.write_text(edit)
        monkeypatch.setattr(specs, "_CACHE", {})
        assert specs.load("server-8xa100", state).name == "server-8xa100"
    assert len(parses) == 2  # the first load and the one after the edit


COUNT = "import pynvml; pynvml.nvmlInit(); print(pynvml.nvmlDeviceGetCount())"


def python(code: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60
    )


def test_shim_makes_plain_import_see_the_machine(tmp_path):
    env = dict(os.environ, PYTHONPATH=f"{SHIM_DIR}{os.pathsep}{SRC}", GPUWARDEN_SIM="mixed")
    out = python(COUNT, env)
    assert out.stdout.strip() == "4", out.stderr
    env.pop("GPUWARDEN_SIM")
    out = python("import pynvml; print(pynvml.__file__)", env)
    assert "site-packages" in out.stdout, out.stderr


def test_another_gpuwardens_shim_left_on_the_path_is_passed_over(tmp_path):
    """A shell set up by `gpuwarden sim env` of another copy (an older checkout or venv)
    keeps that copy's shim first on PYTHONPATH: its pynvml.py is not nvidia-ml-py's,
    and loading it as such waited for ever on the simulator's own lock."""
    other = tmp_path / "old-checkout" / "gpuwarden" / "sim"
    (other / "shim").mkdir(parents=True)
    shutil.copy(os.path.join(SHIM_DIR, "pynvml.py"), other / "shim" / "pynvml.py")
    (other / "fake.py").write_text("")
    path = os.pathsep.join([str(other / "shim"), str(SRC)])
    out = python(COUNT, dict(os.environ, PYTHONPATH=path, GPUWARDEN_SIM="mixed"))
    assert out.stdout.strip() == "4", out.stderr


def test_state_file_is_shared_between_processes(tmp_path):
    code = (
        "from gpuwarden.sim import Machine; "
        "Machine.open('server-8xa100').set_gpu(7, utilization=77)"
    )
    env = dict(os.environ, PYTHONPATH=str(SRC))
    subprocess.run([sys.executable, "-c", code], env=env, check=True)
    mod = module("server-8xa100")
    mod.nvmlInit()
    try:
        assert mod.nvmlDeviceGetUtilizationRates(mod.nvmlDeviceGetHandleByIndex(7)).gpu == 77
    finally:
        mod.nvmlShutdown()


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("temp", "-500", "temperature must be 0 to 150, got -500"),
        ("temp", "151", "temperature must be 0 to 150, got 151"),
        ("util", "101", "utilization must be 0 to 100, got 101"),
        ("util", "-1", "utilization must be 0 to 100, got -1"),
        ("mem_util", "200", "memory_utilization must be 0 to 100, got 200"),
        ("power", "nan", "power must be 0 to 5000, got nan"),
        ("power", "-3", "power must be 0 to 5000, got -3.0"),
        ("power", "900", "power must be 0 to 800 on GPU 0, got 900.0"),
        ("clock_sm", "-1", "clock_sm must be 0 to 10000, got -1"),
        ("pcie_replay", "-1", "pcie_replay must be 0 to 4.29497e+09, got -1"),
        ("mem", "100GiB", "memory_used must be 0 to 80.0GiB on GPU 0, got 107374182400"),
        ("temp", "hot", "bad value for temperature: 'hot'"),
    ],
)
def test_sim_set_refuses_values_a_card_cannot_report(
    sim, capsys: pytest.CaptureFixture[str], field: str, value: str, message: str
) -> None:
    from gpuwarden.cli import main

    sim("server-8xa100")
    before = Machine.open().state()["gpus"][0]
    assert main(["sim", "set", "--gpu", "0", f"{field}={value}"]) == 2
    assert capsys.readouterr().err == f"gpuwarden sim: {message}\n"
    assert Machine.open().state()["gpus"][0] == before  # nothing was changed


def test_sim_set_fan_on_a_fanless_card_says_not_supported(sim, capsys) -> None:
    from gpuwarden.cli import main

    sim("server-8xa100")
    assert main(["sim", "set", "--gpu", "0", "fan=50"]) == 2
    assert "has no fan: NVML reports NotSupported" in capsys.readouterr().err
    sim("workstation-3x3090")
    assert main(["sim", "set", "--gpu", "0", "fan=70", "temp=80"]) == 0
    gpu = Machine.open().state()["gpus"][0]
    assert (gpu["fan"], gpu["temperature"]) == (70, 80)
