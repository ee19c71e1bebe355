"""The field's NVML tools run unchanged on every bundled machine, and the simulator
answers the calls they make as a real driver of each card's generation does.

nvitop, nvisel, gpustat, NVIDIA's nvidia-ml-py example and pynvml_utils' query run
as their users run them (processes, `gpuwarden sim env`'s PYTHONPATH), all of them
at once; any traceback or "Function Not Found" fails. The unit checks below pin
answers that differ by generation against what real drivers return.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from gpuwarden.sim import Machine, specs
from gpuwarden.sim.fake import SHIM_DIR, module

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent

# NVIDIA's example, as nvidia-ml-py's example.py writes its device query: every
# NVMLError is printed in place ("N/A" for NotSupported), so one the simulator does
# not know shows as "Function Not Found".
EXAMPLE = r"""
from pynvml import *

def handleError(err):
    return "N/A" if err.value == NVML_ERROR_NOT_SUPPORTED else err.__str__()

def tag(name, fn, *args):
    try:
        value = fn(*args)
    except NVMLError as err:
        value = handleError(err)
    print(f"    <{name}>{value}</{name}>")

BRANDS = {NVML_BRAND_UNKNOWN: "Unknown", NVML_BRAND_QUADRO: "Quadro", NVML_BRAND_TESLA: "Tesla",
          NVML_BRAND_NVS: "NVS", NVML_BRAND_GRID: "Grid", NVML_BRAND_GEFORCE: "GeForce",
          NVML_BRAND_TITAN: "Titan", NVML_BRAND_NVIDIA_RTX: "NVIDIA RTX",
          NVML_BRAND_NVIDIA: "NVIDIA"}
VIRT = {NVML_GPU_VIRTUALIZATION_MODE_NONE: "None",
        NVML_GPU_VIRTUALIZATION_MODE_PASSTHROUGH: "Pass-Through",
        NVML_GPU_VIRTUALIZATION_MODE_VGPU: "VGPU",
        NVML_GPU_VIRTUALIZATION_MODE_HOST_VGPU: "Host VGPU",
        NVML_GPU_VIRTUALIZATION_MODE_HOST_VSGA: "Host VSGA"}

try:
    nvmlInit()
    print(f"<driver_version>{nvmlSystemGetDriverVersion()}</driver_version>")
    deviceCount = nvmlDeviceGetCount()
    print(f"<attached_gpus>{deviceCount}</attached_gpus>")
    for i in range(deviceCount):
        handle = nvmlDeviceGetHandleByIndex(i)
        print(f'  <gpu id="{nvmlDeviceGetPciInfo(handle).busId}">')
        print(f"    <product_name>{nvmlDeviceGetName(handle)}</product_name>")
        tag("product_brand", lambda h: BRANDS[nvmlDeviceGetBrand(h)], handle)
        tag("serial", nvmlDeviceGetSerial, handle)
        tag("uuid", nvmlDeviceGetUUID, handle)
        tag("minor_number", nvmlDeviceGetMinorNumber, handle)
        tag("virtualization_mode", lambda h: VIRT[nvmlDeviceGetVirtualizationMode(h)], handle)
        tag("vbios_version", nvmlDeviceGetVbiosVersion, handle)
        tag("multigpu_board", nvmlDeviceGetMultiGpuBoard, handle)
        tag("board_id", nvmlDeviceGetBoardId, handle)
        tag("img_version", nvmlDeviceGetInforomImageVersion, handle)
        tag("oem_object", nvmlDeviceGetInforomVersion, handle, NVML_INFOROM_OEM)
        tag("ecc_object", nvmlDeviceGetInforomVersion, handle, NVML_INFOROM_ECC)
        tag("pwr_object", nvmlDeviceGetInforomVersion, handle, NVML_INFOROM_POWER)
        tag("max_link_gen", nvmlDeviceGetMaxPcieLinkGeneration, handle)
        tag("current_link_gen", nvmlDeviceGetCurrPcieLinkGeneration, handle)
        tag("max_link_width", nvmlDeviceGetMaxPcieLinkWidth, handle)
        tag("current_link_width", nvmlDeviceGetCurrPcieLinkWidth, handle)
        tag("tx_util", nvmlDeviceGetPcieThroughput, handle, NVML_PCIE_UTIL_TX_BYTES)
        tag("rx_util", nvmlDeviceGetPcieThroughput, handle, NVML_PCIE_UTIL_RX_BYTES)
        tag("fan_speed", nvmlDeviceGetFanSpeed, handle)
        tag("performance_state", nvmlDeviceGetPowerState, handle)
        tag("fb_memory_usage", lambda h: nvmlDeviceGetMemoryInfo(h).total, handle)
        tag("bar1_memory_usage", lambda h: nvmlDeviceGetBAR1MemoryInfo(h).bar1Total, handle)
        tag("compute_mode", nvmlDeviceGetComputeMode, handle)
        tag("utilization", lambda h: nvmlDeviceGetUtilizationRates(h).gpu, handle)
        tag("encoder_util", nvmlDeviceGetEncoderUtilization, handle)
        tag("decoder_util", nvmlDeviceGetDecoderUtilization, handle)
        tag("ecc_mode", nvmlDeviceGetEccMode, handle)
        tag("power_draw", nvmlDeviceGetPowerUsage, handle)
        tag("power_limit", nvmlDeviceGetPowerManagementLimit, handle)
        tag("graphics_clock", nvmlDeviceGetClockInfo, handle, NVML_CLOCK_GRAPHICS)
        tag("max_mem_clock", nvmlDeviceGetMaxClockInfo, handle, NVML_CLOCK_MEM)
        tag("applications_clock", nvmlDeviceGetApplicationsClock, handle, NVML_CLOCK_GRAPHICS)
        tag("supported_memory_clocks", nvmlDeviceGetSupportedMemoryClocks, handle)
        tag("processes", lambda h: len(nvmlDeviceGetComputeRunningProcesses(h)), handle)
        print("  </gpu>")
except NVMLError as err:
    print("example.py: " + err.__str__())
try:
    nvmlShutdown()
except NVMLError:
    pass
"""

# pynvml_utils' query, as its README calls it: one dictionary per GPU. Two of its
# sections crash on every current driver and nvidia-ml-py whatever the machine (the
# brand table stops at GeForce, so "NVIDIA" and "NVIDIA RTX" boards raise KeyError
# under `name`; the throttle section names nvmlClocksThrottleReasonUnknown, which
# nvidia-ml-py 12.535 and later do not define), so the query asks for every other one.
DEVICE_QUERY = r"""
import json
import pynvml_utils.smi as smi
from pynvml import NVMLError, nvmlInit, nvmlShutdown
skip = ("NVSMI_ALL", "NVSMI_NAME")
every = [v for k, v in vars(smi).items() if k.startswith("NVSMI_") and isinstance(v, int)
         and k not in skip and not k.startswith("NVSMI_CLOCK_THROTTLE")]
try:  # a machine without a driver: say so before nvidia_smi, whose __del__ would
    nvmlInit()  # shut down an NVML it never started (a traceback on a real one too)
except NVMLError as err:
    raise SystemExit(f"pynvml_utils: {err}")
nvmlShutdown()
print(json.dumps(smi.nvidia_smi.getInstance().DeviceQuery(every), default=str))
"""

# py3nvml: NVML bindings of its own (an old copy of nvidia-ml-py's, which load the
# library with CDLL), reached through the shim's `py3nvml` package.
PY3NVML = r"""
import json
from py3nvml import py3nvml as nv, utils
try:
    nv.nvmlInit()
except nv.NVMLError as err:
    raise SystemExit(f"py3nvml: {err}")
gpus = []
for i in range(nv.nvmlDeviceGetCount()):
    h = nv.nvmlDeviceGetHandleByIndex(i)
    gpus.append({"name": nv.nvmlDeviceGetName(h), "uuid": nv.nvmlDeviceGetUUID(h),
                 "total": nv.nvmlDeviceGetMemoryInfo(h).total,
                 "pids": [p.pid for p in nv.nvmlDeviceGetComputeRunningProcesses(h)]})
nv.nvmlShutdown()
sim = getattr(nv, "gpuwarden_sim_spec", None)
print(json.dumps({"gpus": gpus, "free": utils.get_free_gpus(), "sim": sim}))
"""

TOOLS = {
    "nvitop": ["nvitop", "-1"],
    "nvisel": ["nvisel"],
    "gpustat": ["gpustat", "--show-all"],
    "example": [sys.executable, "-c", EXAMPLE],
    "pynvml_utils": [sys.executable, "-c", DEVICE_QUERY],
    "py3nvml": [sys.executable, "-c", PY3NVML],
}
SPECS = specs.bundled()


def _command(tool: str) -> list[str]:
    argv = TOOLS[tool]
    if argv[0] == sys.executable:
        missing = tool in ("pynvml_utils", "py3nvml") and importlib.util.find_spec(tool) is None
        path = None
    else:
        path = BIN / argv[0]
        missing = not path.exists()
    if missing:
        if os.environ.get("GPUWARDEN_REQUIRE_COMPONENTS"):
            pytest.fail(f"{tool} is not installed in {BIN.parent}")
        pytest.skip(f"{tool} is not installed (scripts/test installs it)")
    return argv if path is None else [str(path), *argv[1:]]


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[tuple[str, str], tuple[int, str]]:
    """(spec, tool) -> (exit status, stdout + stderr) of every tool on every spec, run
    concurrently on one fresh simulated state per spec."""
    state = tmp_path_factory.mktemp("sim")
    jobs = {}
    for spec in SPECS:
        Machine.open(spec, str(state)).reset()  # write each state once, before the readers
        for tool in TOOLS:
            env = dict(
                os.environ,
                GPUWARDEN_SIM=spec,
                GPUWARDEN_SIM_STATE=str(state),
                PYTHONPATH=f"{SHIM_DIR}{os.pathsep}{ROOT / 'src'}",
                COLUMNS="160",
            )
            jobs[spec, tool] = (_command(tool), env)

    def run(key: tuple[str, str]) -> tuple[int, str]:
        argv, env = jobs[key]
        out = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120)
        return out.returncode, out.stdout + out.stderr

    with ThreadPoolExecutor(max_workers=6) as pool:
        return dict(zip(jobs, pool.map(run, jobs)))


@pytest.mark.parametrize("tool", TOOLS)
@pytest.mark.parametrize("spec", SPECS)
def test_tool_runs_clean(runs, spec: str, tool: str) -> None:
    code, output = runs[spec, tool]
    for sign in ("Traceback", "Function Not Found", "FunctionNotFound"):
        assert sign not in output, f"{tool} on {spec}:\n{output}"
    machine = specs.load(spec)
    gpus = len(machine.initial_state()["gpus"])
    if not machine.driver:  # no driver: each tool says so in its own words
        assert "not found" in output.lower(), output
        return
    assert code == 0, output
    if tool == "example":
        assert output.count("<product_brand>") == gpus
        assert "<virtualization_mode>None<" in output
        assert "N/A</supported_memory_clocks>" not in output
    elif tool == "pynvml_utils":
        found = json.loads(output)["gpu"]
        assert len(found) == gpus
        for gpu in found:
            assert gpu["supported_clocks"], gpu["id"]
            assert gpu["pci"]["pci_gpu_link_info"]["link_widths"]["max_link_width"] == "16x"
    elif tool == "nvisel":
        assert "CUDA_VISIBLE_DEVICES=" in output
    elif tool == "py3nvml":
        found = json.loads(output)
        assert found["sim"] == machine.name  # the simulated library, not libnvidia-ml
        assert len(found["gpus"]) == gpus
        assert all(g["uuid"].startswith("GPU-") and g["total"] > 0 for g in found["gpus"])
        assert found["free"] == [not g["pids"] for g in found["gpus"]]


# -- answers by generation ----------------------------------------------------


def _nv(spec, tmp_path):
    nv = module(spec, str(tmp_path))
    nv.nvmlInit()
    return nv


def test_board_answers_by_card(tmp_path):
    nv = _nv("mixed", tmp_path)  # T4, V100, RTX A6000, A100 80GB (MIG)
    t4, v100, a6000, a100 = (nv.nvmlDeviceGetHandleByIndex(i) for i in range(4))
    assert [nv.nvmlDeviceGetBrand(h) for h in (t4, v100, a6000, a100)] == [
        nv.NVML_BRAND_NVIDIA,
        nv.NVML_BRAND_TESLA,
        nv.NVML_BRAND_NVIDIA_RTX,
        nv.NVML_BRAND_NVIDIA,
    ]
    assert [nv.nvmlDeviceGetArchitecture(h) for h in (t4, v100, a6000, a100)] == [
        nv.NVML_DEVICE_ARCH_TURING,
        nv.NVML_DEVICE_ARCH_VOLTA,
        nv.NVML_DEVICE_ARCH_AMPERE,
        nv.NVML_DEVICE_ARCH_AMPERE,
    ]
    assert [nv.nvmlDeviceGetMaxPcieLinkGeneration(h) for h in (t4, v100, a100)] == [3, 3, 4]
    assert nv.nvmlDeviceGetVirtualizationMode(a100) == nv.NVML_GPU_VIRTUALIZATION_MODE_NONE
    # BAR1: 128 GiB on an A100 80GB; a 3g.40gb MIG device maps 4 of its 8 memory slices
    assert nv.nvmlDeviceGetBAR1MemoryInfo(a100).bar1Total == 128 * 2**30
    mig = nv.nvmlDeviceGetMigDeviceHandleByIndex(a100, 0)
    assert nv.nvmlDeviceGetBAR1MemoryInfo(mig).bar1Total == 65535 * 2**20
    assert nv.nvmlDeviceGetBAR1MemoryInfo(t4).bar1Total == 256 * 2**20
    # ECC by location: Volta still counts texture memory, Ampere has none to count
    loc = nv.NVML_MEMORY_LOCATION_TEXTURE_MEMORY
    assert nv.nvmlDeviceGetMemoryErrorCounter(v100, 1, 0, loc) == 0
    with pytest.raises(nv.NVMLError_NotSupported):
        nv.nvmlDeviceGetMemoryErrorCounter(a100, 1, 0, loc)
    dram = nv.NVML_MEMORY_LOCATION_DEVICE_MEMORY
    assert nv.nvmlDeviceGetMemoryErrorCounter(v100, 1, 0, dram) == 2  # the spec's two
    assert len(nv.nvmlDeviceGetRetiredPages(v100, 1)) == 2
    with pytest.raises(nv.NVMLError_NotSupported):
        nv.nvmlDeviceGetRetiredPages(a100, 1)  # Ampere remaps rows instead


def test_clocks_and_link_by_card(tmp_path):
    nv = _nv("workstation-3x3090", tmp_path)
    busy, idle = nv.nvmlDeviceGetHandleByIndex(1), nv.nvmlDeviceGetHandleByIndex(0)
    assert nv.nvmlDeviceGetBrand(busy) == nv.NVML_BRAND_GEFORCE
    # GeForce: no applications clocks; an idle card's link trains down to gen 1
    with pytest.raises(nv.NVMLError_NotSupported):
        nv.nvmlDeviceGetApplicationsClock(busy, nv.NVML_CLOCK_GRAPHICS)
    assert nv.nvmlDeviceGetCurrPcieLinkGeneration(busy) == 4
    assert nv.nvmlDeviceGetCurrPcieLinkGeneration(idle) == 1
    assert nv.nvmlDeviceGetMaxPcieLinkGeneration(idle) == 4
    assert nv.nvmlDeviceGetPcieThroughput(busy, nv.NVML_PCIE_UTIL_RX_BYTES) > 0
    assert nv.nvmlDeviceGetPcieThroughput(idle, nv.NVML_PCIE_UTIL_RX_BYTES) == 0
    assert nv.nvmlDeviceGetSupportedMemoryClocks(busy)[0] == 9751

    nv = _nv("server-8xa100", tmp_path)
    a100 = nv.nvmlDeviceGetHandleByIndex(0)
    assert nv.nvmlDeviceGetSupportedMemoryClocks(a100) == [1593]  # HBM: one clock
    graphics = nv.nvmlDeviceGetSupportedGraphicsClocks(a100, 1593)
    assert (graphics[0], graphics[-1], graphics[0] - graphics[1]) == (1410, 210, 15)
    with pytest.raises(nv.NVMLError_NotFound):
        nv.nvmlDeviceGetSupportedGraphicsClocks(a100, 1000)
    assert nv.nvmlDeviceGetDefaultApplicationsClock(a100, nv.NVML_CLOCK_MEM) == 1593
    assert nv.nvmlDeviceGetCurrPcieLinkWidth(a100) == 16


def test_field_values(tmp_path):
    nv = _nv("server-8xh200", tmp_path)
    busy, idle = nv.nvmlDeviceGetHandleByIndex(0), nv.nvmlDeviceGetHandleByIndex(7)
    fields = [
        nv.NVML_FI_DEV_MEMORY_TEMP,
        nv.NVML_FI_DEV_NVLINK_LINK_COUNT,
        (nv.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX, 17),
        (nv.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX, 18),  # H200 has 18 links: 0-17
        nv.NVML_FI_DEV_ECC_CURRENT,  # not simulated: NotSupported in its own entry
    ]
    first = nv.nvmlDeviceGetFieldValues(busy, fields)
    unsupported = nv.NVML_ERROR_NOT_SUPPORTED
    assert [v.nvmlReturn for v in first] == [0, 0, 0, unsupported, unsupported]
    assert first[0].value.uiVal == nv.nvmlDeviceGetTemperature(busy, 0) + 3  # HBM runs warmer
    assert first[1].value.uiVal == 18
    second = nv.nvmlDeviceGetFieldValues(busy, fields)
    assert second[2].value.ullVal > first[2].value.ullVal  # data moves on a busy GPU
    still = [nv.nvmlDeviceGetFieldValues(idle, fields[2:3])[0].value.ullVal for _ in (0, 1)]
    assert still[0] == still[1]
    nv = _nv("workstation-3x3090", tmp_path)  # GDDR6X: no memory sensor, no NVLink
    geforce = nv.nvmlDeviceGetFieldValues(nv.nvmlDeviceGetHandleByIndex(0), fields[:2])
    assert [v.nvmlReturn for v in geforce] == [nv.NVML_ERROR_NOT_SUPPORTED, 0]
    assert geforce[1].value.uiVal == 0


# -- GPM --------------------------------------------------------------------------


def _metrics(nv, take, ids):
    """Two samples `take(sample)` apart in time, turned into {metric id: value}."""
    first, second = nv.nvmlGpmSampleAlloc(), nv.nvmlGpmSampleAlloc()
    take(first)
    take(second)
    request = nv.c_nvmlGpmMetricsGet_t()
    request.version = nv.NVML_GPM_METRICS_GET_VERSION
    request.numMetrics = len(ids)
    request.sample1, request.sample2 = first, second
    for i, metric in enumerate(ids):
        request.metrics[i].metricId = metric
    nv.nvmlGpmMetricsGet(request)
    nv.nvmlGpmSampleFree(first)
    nv.nvmlGpmSampleFree(second)
    return {
        m.metricId: (m.value if m.nvmlReturn == 0 else None) for m in request.metrics[: len(ids)]
    }


def test_gpm_only_from_hopper_on(tmp_path):
    nv = _nv("server-8xa100", tmp_path)
    a100 = nv.nvmlDeviceGetHandleByIndex(0)
    assert nv.nvmlGpmQueryDeviceSupport(a100).isSupportedDevice == 0
    with pytest.raises(nv.NVMLError_NotSupported):
        nv.nvmlGpmSampleGet(a100, nv.nvmlGpmSampleAlloc())


def test_gpm_metrics_follow_the_load(tmp_path):
    nv = _nv("server-8xh200", tmp_path)
    busy, idle = nv.nvmlDeviceGetHandleByIndex(0), nv.nvmlDeviceGetHandleByIndex(7)
    assert nv.nvmlGpmQueryDeviceSupport(busy).isSupportedDevice == 1
    ids = [
        nv.NVML_GPM_METRIC_GRAPHICS_UTIL,
        nv.NVML_GPM_METRIC_ANY_TENSOR_UTIL,
        nv.NVML_GPM_METRIC_DRAM_BW_UTIL,
        nv.NVML_GPM_METRIC_PCIE_RX_PER_SEC,
        nv.NVML_GPM_METRIC_NVLINK_TOTAL_TX_PER_SEC,
        nv.NVML_GPM_METRIC_NVLINK_L17_TX_PER_SEC,
        nv.NVML_GPM_METRIC_C2C_TOTAL_TX_PER_SEC,  # no Grace CPU here
    ]
    gr, tensor, dram, pcie, nvlink, l17, c2c = ids
    load = _metrics(nv, lambda s: nv.nvmlGpmSampleGet(busy, s), ids)
    assert load[gr] == nv.nvmlDeviceGetUtilizationRates(busy).gpu
    assert 0 < load[tensor] < load[gr]
    assert load[dram] == nv.nvmlDeviceGetUtilizationRates(busy).memory
    assert load[pcie] > 0 and load[nvlink] == pytest.approx(18 * load[l17])
    assert load[c2c] is None
    quiet = _metrics(nv, lambda s: nv.nvmlGpmSampleGet(idle, s), ids)
    assert (quiet[gr], quiet[tensor], quiet[pcie], quiet[nvlink]) == (0, 0, 0, 0)
    Machine.open("server-8xh200", str(tmp_path)).add_process(7, os.getpid(), "1GiB", util=40)
    assert _metrics(nv, lambda s: nv.nvmlGpmSampleGet(idle, s), ids)[gr] == 40


def test_gpm_per_mig_instance(tmp_path):
    spec = tmp_path / "h200-mig.toml"
    spec.write_text(
        'description = "H200 in MIG mode"\n'
        "[[gpu]]\n"
        'model = "H200-SXM-141GB"\n'
        "utilization = 70\n"
        "memory_utilization = 30\n"
        '[[gpu.mig]]\nprofile = "3g.71gb"\n'
        '[[gpu.mig]]\nprofile = "1g.18gb"\n'
        '[[gpu.process]]\nuser = "ann"\ncommand = "python a.py"\nmemory = "20GiB"\nmig = 0\n'
    )
    nv = _nv(str(spec), tmp_path)
    gpu = nv.nvmlDeviceGetHandleByIndex(0)
    used, empty = (
        nv.nvmlDeviceGetGpuInstanceId(nv.nvmlDeviceGetMigDeviceHandleByIndex(gpu, i))
        for i in (0, 1)
    )
    ids = [nv.NVML_GPM_METRIC_SM_UTIL, nv.NVML_GPM_METRIC_PCIE_TX_PER_SEC]
    busy = _metrics(nv, lambda s: nv.nvmlGpmMigSampleGet(gpu, used, s), ids)
    assert busy[ids[0]] > 0 and busy[ids[1]] is None  # PCIe is the whole GPU's
    assert _metrics(nv, lambda s: nv.nvmlGpmMigSampleGet(gpu, empty, s), ids)[ids[0]] == 0
    with pytest.raises(nv.NVMLError_NotFound):
        nv.nvmlGpmMigSampleGet(gpu, 99, nv.nvmlGpmSampleAlloc())


def test_py3nvml_through_the_shim_without_a_simulated_machine_is_the_installed_one(tmp_path):
    """Leaving `sim env`'s PYTHONPATH in place is harmless for py3nvml too: without
    GPUWARDEN_SIM its package is the installed one, which finds no driver here."""
    _command("py3nvml")
    env = {k: v for k, v in os.environ.items() if k != "GPUWARDEN_SIM"}
    env["PYTHONPATH"] = f"{SHIM_DIR}{os.pathsep}{ROOT / 'src'}"
    script = (
        "import py3nvml\nfrom py3nvml import py3nvml as nv\nprint(py3nvml.__file__)\n"
        "try:\n    nv.nvmlInit()\nexcept nv.NVMLError as err:\n    print(type(err).__name__)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    where, error = done.stdout.split()
    assert not where.startswith(SHIM_DIR) and where.endswith("py3nvml/__init__.py")
    if not os.path.exists("/dev/nvidiactl"):  # a machine without NVIDIA's driver
        assert error == "NVMLError_LibraryNotFound"
