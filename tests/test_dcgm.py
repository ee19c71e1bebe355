"""dcgm-exporter's counters and labels (`--dcgm-compat`), per GPU and per MIG instance.

Read through the real inventory path on the simulated machines: `mixed` (an A100 in
MIG mode beside three older cards) and `h200` (Hopper: the profiling counters
through NVML GPM).
"""

from __future__ import annotations

from pathlib import Path

from gpuwarden.exporter.counters import Counters
from gpuwarden.exporter.metrics import View, render
from gpuwarden.leases import LeaseInfo
from gpuwarden.machine.inventory import Gpu, MigInstance, Snapshot, read_snapshot
from scraping import DEFAULT_COUNTERS, LABELS, NOT_EXPORTED, samples, value

SPECS = Path(__file__).resolve().parent.parent / "src" / "gpuwarden" / "sim" / "specs"


def test_every_default_counter_nvml_gives_is_exported_with_current_labels():
    from gpuwarden.exporter.counters import KEYS

    gpu = Gpu(
        index=0,
        uuid="GPU-aaaa",
        name="NVIDIA H100 80GB HBM3",
        pci_bus_id="00000000:19:00.0",
        memory_total=80 * 2**30,
        memory_used=2**30,
        memory_free=79 * 2**30,
        utilization_gpu=50,
        utilization_memory=20,
        temperature=40,
        power_draw=300.0,
        energy_consumed=1.0,
        clock_sm=1980,
        pcie_replay_count=0,
        remapped_rows_failure=False,
        counters=tuple((key, 0.5) for key in KEYS),
    )
    view = View(Snapshot(0.0, "box", (gpu,), driver_version="550.90.07"))
    found = samples(render(view, dcgm_compat=True))
    exported = {name for name, _ in found if name.startswith("DCGM_")}
    assert exported >= set(DEFAULT_COUNTERS) - NOT_EXPORTED
    assert not exported & NOT_EXPORTED
    for (name, labels), _ in found.items():
        if name.startswith("DCGM_"):
            keys = {k for k, _ in labels}
            assert keys >= LABELS and "Hostname" not in keys, (name, keys)
    tensor = value(found, "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", pci_bus_id="00000000:19:00.0")
    assert tensor == 0.5 and value(found, "DCGM_FI_DEV_FB_RESERVED", gpu="0") == 0.5 / 2**20


def test_mig_instances_get_their_own_series_labelled_as_dcgm_exporter_does(sim):
    sim("mixed")
    snap = read_snapshot(counters=Counters())
    a100 = next(g for g in snap.gpus if g.mig_mode)
    slice_uuid = a100.mig_instances[1].uuid  # the 2g.20gb
    lease = LeaseInfo(slice_uuid, "ivan", 4242, "python train.py", 1.0, job="exp-9")
    whole = LeaseInfo(a100.uuid, "judy", 4343, "nvidia-smi mig -lgi", 1.0, job="admin")
    found = samples(render(View(snap, leases=(lease, whole)), dcgm_compat=True))
    gpu = str(a100.index)

    def series(name: str) -> dict[tuple[str, str], float]:
        return {
            (dict(lab).get("GPU_I_ID", ""), dict(lab).get("GPU_I_PROFILE", "")): v
            for (n, lab), v in found.items()
            if n == name and dict(lab)["gpu"] == gpu
        }

    # memory per MIG instance only, as NVML gives it; none for the whole GPU
    expected = {(str(m.gpu_instance_id), m.name): m.memory_used / 2**20 for m in a100.mig_instances}
    assert series("DCGM_FI_DEV_FB_USED") == expected
    assert {p for _, p in series("DCGM_FI_DEV_FB_TOTAL")} == {"3g.40gb", "2g.20gb", "1g.10gb"}
    # what NVML gives only for the whole GPU, once, without instance labels
    assert series("DCGM_FI_DEV_GPU_TEMP") == {("", ""): float(a100.temperature)}
    # no utilization per MIG instance (nor for a GPU in MIG mode) in NVML: none made up
    assert series("DCGM_FI_DEV_GPU_UTIL") == {}
    assert series("gpuwarden_gpu_utilization_ratio") == {}
    # the lease on one slice, and the processes, on their instance
    leased = series("gpuwarden_gpu_leased")
    assert leased.pop(("", "")) == 1  # judy's lease on the whole GPU, not lost either
    assert leased == {
        ("1", "3g.40gb"): 0,
        ("2", "2g.20gb"): 1,
        ("3", "1g.10gb"): 0,
        ("5", "1g.10gb"): 0,
    }
    assert value(found, "gpuwarden_gpu_leased", user="ivan", job="exp-9", GPU_I_PROFILE="2g.20gb")
    procs = {
        dict(lab)["user"]: dict(lab)["GPU_I_PROFILE"]
        for (n, lab), _ in found.items()
        if n == "gpuwarden_process_memory_used_bytes"
    }
    assert procs == {"erin": "", "frank": "", "grace": "3g.40gb", "heidi": "1g.10gb"}
    mig_memory = series("gpuwarden_mig_memory_total_bytes")
    assert mig_memory == {
        (str(m.gpu_instance_id), m.name): m.memory_total for m in a100.mig_instances
    }
    # the other cards' counters that NVML gives on them
    assert value(found, "DCGM_FI_DEV_MEM_CLOCK", gpu="0") > 0
    assert value(found, "DCGM_FI_DEV_ENC_UTIL", gpu="2") == 0


def test_counters_are_read_only_when_asked(sim):
    sim("mixed")
    snap = read_snapshot()
    assert all(g.counters == () for g in snap.gpus)
    assert all(m.counters == () for g in snap.gpus for m in g.mig_instances)


def test_a_mig_instance_with_no_instance_id_is_still_listed():
    gpu = Gpu(
        index=0,
        uuid="GPU-aaaa",
        name="NVIDIA A100-SXM4-80GB",
        mig_mode=True,
        mig_instances=(MigInstance("MIG-aaaa", 0, None, None, "1g.10gb", 10 * 2**30, 2**20),),
    )
    found = samples(render(View(Snapshot(0.0, "box", (gpu,))), dcgm_compat=True))
    assert value(found, "DCGM_FI_DEV_FB_USED", GPU_I_PROFILE="1g.10gb", GPU_I_ID="") == 1.0


def test_profiling_counters_come_from_gpm_between_two_reads(sim):
    """Hopper's GPM gives the tensor, engine and DRAM ratios as averages between two
    samples: none on the first read, on each later one the average since the last."""
    sim("server-8xh200")
    counters = Counters()
    first = read_snapshot(counters=counters)
    assert not any("tensor_active" in dict(g.counters) for g in first.gpus)
    second = read_snapshot(counters=counters)
    for gpu in second.gpus:
        found = dict(gpu.counters)
        assert 0.0 <= found["tensor_active"] <= 1.0
        assert 0.0 <= found["graphics_engine_active"] <= 1.0
        busy = bool(gpu.utilization_gpu)
        assert (found["tensor_active"] > 0) == busy, (gpu.index, found)
        assert (found["pcie_rx_bytes_per_second"] > 0) == busy
    text = render(View(second), dcgm_compat=True)
    busy_gpu = next(g for g in second.gpus if g.utilization_gpu)
    tensor = value(samples(text), "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", gpu=str(busy_gpu.index))
    assert tensor == dict(busy_gpu.counters)["tensor_active"]


def test_no_gpm_before_hopper_so_no_profiling_counters(sim):
    sim("mixed")
    counters = Counters()
    read_snapshot(counters=counters)
    snap = read_snapshot(counters=counters)
    found = samples(render(View(snap), dcgm_compat=True))
    assert not [
        name for name, _ in found if name.startswith("DCGM_FI_PROF_") and "PCIE" not in name
    ]


def test_gpm_per_mig_instance_on_hopper(sim, tmp_path):
    spec = tmp_path / "h200-mig.toml"
    spec.write_text(
        (SPECS / "h200.toml").read_text()
        + "utilization = 90\nmemory_utilization = 40\n"
        + '[[gpu.mig]]\nprofile = "3g.71gb"\n[[gpu.mig]]\nprofile = "1g.18gb"\n'
        + '[[gpu.process]]\nuser = "kim"\ncommand = "python train.py"\nmemory = "20GiB"\nmig = 0\n'
    )
    sim(str(spec))
    counters = Counters()
    read_snapshot(counters=counters)
    snap = read_snapshot(counters=counters)
    found = samples(render(View(snap), dcgm_compat=True))
    tensor = {
        dict(lab)["GPU_I_PROFILE"]: v
        for (n, lab), v in found.items()
        if n == "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE"
    }
    # kim's job runs in the 3g.71gb instance; the 1g.18gb one is idle
    assert set(tensor) == {"3g.71gb", "1g.18gb"}
    assert tensor["3g.71gb"] > 0 and tensor["1g.18gb"] == 0


def test_once_on_hopper_prints_the_profiling_counters_and_types_the_counters(cli, tmp_path):
    """`exporter --once` samples GPM twice: the ratios are averages between two samples,
    and a single read has none. The counters dcgm-exporter keeps without `_total` are
    typed as it types them."""
    done = cli(
        *("--sim", "server-8xh200", "exporter", "--once", "--dcgm-compat"),
        env={"GPUWARDEN_SIM_STATE": str(tmp_path)},
    )
    assert done.returncode == 0, done.stderr
    found = samples(done.stdout)
    tensor = {dict(lab)["gpu"]: v for (n, lab), v in found.items() if n.endswith("TENSOR_ACTIVE")}
    assert len(tensor) == 8 and sum(v > 0 for v in tensor.values()) == 6, tensor  # 6 busy
    for name in ("GR_ENGINE_ACTIVE", "DRAM_ACTIVE"):
        assert len([n for n, _ in found if n == f"DCGM_FI_PROF_{name}"]) == 8, name
    types = dict(
        line.split()[2:4] for line in done.stdout.splitlines() if line.startswith("# TYPE")
    )
    assert types["DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"] == "counter"
    assert types["DCGM_FI_DEV_PCIE_REPLAY_COUNTER"] == "counter"
    assert types["DCGM_FI_DEV_GPU_TEMP"] == "gauge"
    assert "untyped" not in types.values(), types


def test_served_counters_are_typed_in_prometheus_text_and_unknown_in_openmetrics():
    """Prometheus' text format lets a counter keep dcgm-exporter's name without `_total`;
    OpenMetrics does not, so there the same series stays `unknown`."""
    import urllib.request

    from gpuwarden.exporter.server import ViewCache, serve
    from machines import busy_box

    server = serve("127.0.0.1:0", dcgm_compat=True, cache=ViewCache(busy_box, cache_seconds=0))
    try:
        bodies = {}
        for accept in ("text/plain", "application/openmetrics-text; version=1.0.0"):
            request = urllib.request.Request(
                f"http://127.0.0.1:{server.port}/metrics", headers={"Accept": accept}
            )
            with urllib.request.urlopen(request, timeout=5) as reply:
                bodies[accept.split(";")[0]] = reply.read().decode()
    finally:
        server.close()
    name = "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"
    assert f"# TYPE {name} counter\n" in bodies["text/plain"]
    assert f"# TYPE {name} unknown\n" in bodies["application/openmetrics-text"]
    assert f"\n{name}{{" in bodies["text/plain"]  # the exact name, no `_total`
