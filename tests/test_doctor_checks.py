"""The doctor's checks on hand-built Facts: each combination names its finding and level."""

from __future__ import annotations

from typing import Any, Optional

import pytest

from gpuwarden.doctor import cuda_compat
from gpuwarden.doctor.checks import run_checks
from gpuwarden.doctor.facts import Facts, TorchBuild, TorchRuntime
from gpuwarden.doctor.findings import FAIL, INFO, PASS, SKIP, WARN, Finding, exit_code
from gpuwarden.health.drain import Drain
from gpuwarden.machine.inventory import Gpu, GpuProcess, Snapshot

GIB = 1 << 30
A100 = ("NVIDIA A100-SXM4-80GB", (8, 0))
RTX5090 = ("NVIDIA GeForce RTX 5090", (12, 0))
RTX3090 = ("NVIDIA GeForce RTX 3090", (8, 6))
H100 = ("NVIDIA H100 80GB HBM3", (9, 0))


def gpu(index: int, model: tuple[str, tuple[int, int]] = A100, **kw: Any) -> Gpu:
    fields: dict[str, Any] = dict(
        index=index,
        uuid=kw.pop("uuid", f"GPU-{index:02d}aa0000-1111-2222-3333-444455556666"),
        name=model[0],
        compute_capability=model[1],
        memory_total=80 * GIB,
        memory_used=1 * GIB,
        persistence_mode=True,
        pci_bus_id=f"00000000:{index + 0x10:02X}:00.0",
    )
    fields.update(kw)
    return Gpu(**fields)


def snap(*gpus: Gpu, driver: Optional[str] = "550.54.15", cuda=(12, 4), error=None) -> Snapshot:
    return Snapshot(
        taken_at=0.0,
        hostname="box",
        gpus=tuple(gpus),
        driver_version=driver if gpus or error is None else None,
        cuda_driver_version=cuda if gpus or error is None else None,
        error=error,
    )


def torch(
    version: str = "2.6.0+cu126",
    cuda: Optional[str] = "12.6",
    archs: Optional[tuple[str, ...]] = None,
    **kw: Any,
) -> TorchBuild:
    if archs is None and cuda:
        wheel = cuda_compat.wheel_archs(
            cuda_compat.variant_of(version, cuda) or "", cuda_compat.parse_version(version)
        )
        archs = wheel.archs if wheel else None
    kw.setdefault("nccl", bool(cuda))
    kw.setdefault("distributed", True)
    return TorchBuild(
        installed=True,
        version=version,
        cuda=cuda,
        arch_list=archs if cuda else (),
        arch_source="torch",
        location="/site-packages/torch",
        **kw,
    )


CPU_TORCH = TorchBuild(
    installed=True, version="2.13.0+cpu", cuda=None, arch_list=(), nccl=False, distributed=True
)
NO_TORCH = TorchBuild(installed=False, skipped="torch is not installed")


def facts(snapshot: Snapshot, t: TorchBuild = NO_TORCH, env=None, **kw: Any) -> Facts:
    return Facts(snapshot=snapshot, environ=dict(env or {}), torch=t, **kw)


def pick(found: list[Finding], check: str, level: Optional[str] = None) -> list[Finding]:
    return [f for f in found if f.check == check and (level is None or f.level == level)]


def one(found: list[Finding], check: str, level: str) -> Finding:
    hits = pick(found, check, level)
    assert len(hits) == 1, f"expected one {level} {check}, got: {found}"
    return hits[0]


# -- driver and PyTorch build -----------------------------------------------------------


def test_driver_pass_names_version_and_cuda():
    found = run_checks(facts(snap(gpu(0))))
    f = one(found, "driver", PASS)
    assert "550.54.15" in f.title and "12.4" in f.title


def test_no_driver_is_info_without_cuda_torch_and_warn_with_it():
    s = snap(error="NVML Shared Library Not Found")
    assert one(run_checks(facts(s, CPU_TORCH)), "driver", INFO)
    f = one(run_checks(facts(s, torch())), "driver", WARN)
    assert "nvidia-smi" in f.fix and "NVML Shared Library" in f.saw


def test_ancient_driver_warns():
    f = one(run_checks(facts(snap(gpu(0), driver="418.87.01", cuda=(10, 1)))), "driver", WARN)
    assert "525.60.13" in f.fix


def test_cpu_only_torch_on_gpu_box_fails_with_cuda_install_line():
    found = run_checks(facts(snap(gpu(0), gpu(1)), CPU_TORCH))
    f = one(found, "torch.build", FAIL)
    assert "CPU-only" in f.title and "2 NVIDIA GPU" in f.title
    # A 12.4 driver and torch 2.13: the closest build it runs (minor-version compatible).
    assert "--index-url https://download.pytorch.org/whl/cu126" in f.fix
    assert "torch==2.13.0" in f.fix
    assert exit_code(found) == 1


def test_cpu_only_torch_install_line_follows_the_driver():
    older = TorchBuild(installed=True, version="2.5.1+cpu", cuda=None, arch_list=())
    f = one(run_checks(facts(snap(gpu(0), cuda=(12, 4)), older)), "torch.build", FAIL)
    assert f.fix.endswith("whl/cu124") and "torch==2.5.1" in f.fix
    newest = one(
        run_checks(facts(snap(gpu(0), driver="580.65.06", cuda=(13, 0)), CPU_TORCH)),
        "torch.build",
        FAIL,
    )
    assert newest.fix.endswith("whl/cu130")


def test_cpu_only_torch_without_gpus_passes():
    found = run_checks(facts(snap(), CPU_TORCH))
    assert one(found, "torch.build", PASS)
    assert exit_code(found) == 0


def test_rocm_build_on_nvidia_fails():
    rocm = TorchBuild(installed=True, version="2.6.0+rocm6.2", cuda=None, hip="6.2", arch_list=())
    assert one(run_checks(facts(snap(gpu(0)), rocm)), "torch.build", FAIL)


def test_without_torch_every_torch_check_skips_with_reason():
    found = run_checks(facts(snap(gpu(0))))
    for check in ("torch.build", "driver.toolkit", "kernels", "distributed.backend"):
        f = one(found, check, SKIP)
        assert f.title
    assert "cu124" in one(found, "torch.build", SKIP).fix  # what to install for this driver
    assert exit_code(found) == 0


def test_cuda_torch_passes_and_reports_cudnn_nccl():
    t = torch("2.5.1+cu124", "12.4", cudnn=90100, nccl_version="2.21.5")
    f = one(run_checks(facts(snap(gpu(0)), t)), "torch.build", PASS)
    assert "CUDA 12.4" in f.title and "90100" in f.saw and "2.21.5" in f.saw


def test_mps_on_apple_silicon():
    mac = snap(error="no NVML on macOS")
    no_mps = TorchBuild(installed=True, version="2.6.0", cuda=None, arch_list=(), mps=False)
    found = run_checks(facts(mac, no_mps, platform="darwin", machine="arm64"))
    assert one(found, "torch.mps", WARN)
    assert one(found, "driver", INFO)
    ok = TorchBuild(installed=True, version="2.6.0", cuda=None, arch_list=(), mps=True)
    assert one(run_checks(facts(mac, ok, platform="darwin", machine="arm64")), "torch.mps", PASS)
    assert not pick(run_checks(facts(mac, ok)), "torch.mps")  # Linux: not reported


# -- driver vs toolkit -------------------------------------------------------------------


def test_old_driver_new_torch_major_fails():
    # torch cu130 on a 12.4 driver: a newer major never runs.
    found = run_checks(facts(snap(gpu(0)), torch("2.9.0+cu130", "13.0")))
    f = one(found, "driver.toolkit", FAIL)
    assert "too old" in f.title
    assert "580.65.06" in f.fix and "whl/cu12" in f.fix


def test_old_driver_newer_minor_warns_minor_compat():
    found = run_checks(facts(snap(gpu(0), driver="535.104.05", cuda=(12, 2)), torch()))
    f = one(found, "driver.toolkit", WARN)
    assert "minor-version" in f.title
    assert "560.28.03" in f.fix  # the driver that runs CUDA 12.6 outright


def test_cuda_11_driver_cuda_12_torch_fails():
    found = run_checks(facts(snap(gpu(0), driver="520.61.05", cuda=(11, 8)), torch()))
    f = one(found, "driver.toolkit", FAIL)
    assert "cu118" in f.fix


def test_driver_newer_than_toolkit_passes():
    found = run_checks(facts(snap(gpu(0), driver="570.86.15", cuda=(12, 8)), torch()))
    assert one(found, "driver.toolkit", PASS)


@pytest.mark.parametrize(
    "toolkit, driver_cuda, driver, level",
    [
        ((12, 6), (12, 6), "560.28.03", "ok"),
        ((11, 8), (12, 4), "550.54.15", "ok"),
        ((12, 8), (12, 4), "550.54.15", "minor-compat"),
        ((13, 0), (12, 9), "575.51.03", "too-old"),
        ((12, 1), (11, 8), "520.61.05", "too-old"),
        ((12, 4), None, "510.47.03", "too-old"),  # below 12.x's minor-compat minimum
        ((12, 4), None, "550.54.14", "ok"),
        ((12, 6), None, "535.54.03", "minor-compat"),
        ((11, 8), None, "450.80.02", "minor-compat"),
    ],
)
def test_driver_runs_rules(toolkit, driver_cuda, driver, level):
    assert cuda_compat.driver_runs(toolkit, driver_cuda, driver).level == level


# -- kernels -----------------------------------------------------------------------------


def test_sm120_card_with_cu126_wheel_fails_naming_gpu_and_wheels():
    found = run_checks(facts(snap(gpu(0, RTX5090), driver="570.133.07", cuda=(12, 8)), torch()))
    f = one(found, "kernels", FAIL)
    assert "GPU 0" in f.title and "RTX 5090" in f.title and "sm_120" in f.title
    assert "no kernel image is available" in f.title
    assert "cu128" in f.fix and "cu130" in f.fix and "cu126" not in f.fix.split(";")[0]
    assert f.fix.rstrip().endswith("whl/cu128")  # the driver (12.8) runs cu128, not cu130
    assert f.gpu == gpu(0, RTX5090).uuid
    assert exit_code(found) == 1


def test_sm120_fix_says_update_driver_when_driver_runs_no_supporting_wheel():
    found = run_checks(facts(snap(gpu(0, RTX5090), driver="550.54.15", cuda=(12, 4)), torch()))
    f = one(found, "kernels", FAIL)
    assert "after updating the NVIDIA driver" not in f.fix  # 12.8 runs via minor compat on 550
    old = run_checks(facts(snap(gpu(0, RTX5090), driver="520.61.05", cuda=(11, 8)), torch()))
    assert "after updating the NVIDIA driver" in one(old, "kernels", FAIL).fix


def test_old_gpu_on_new_wheel_points_to_cu126():
    maxwell = ("NVIDIA GeForce GTX 980", (5, 2))
    t = torch("2.11.0+cu128", "12.8")
    found = run_checks(facts(snap(gpu(0, maxwell), driver="570.86.15", cuda=(12, 8)), t))
    f = one(found, "kernels", FAIL)
    assert "sm_52" in f.title and "cu126" in f.fix


def test_volta_dropped_from_cu128_in_2_11_but_not_2_10():
    v100 = ("Tesla V100-SXM2-32GB", (7, 0))
    s = snap(gpu(0, v100), driver="570.86.15", cuda=(12, 8))
    assert one(run_checks(facts(s, torch("2.11.0+cu128", "12.8"))), "kernels", FAIL)
    assert one(run_checks(facts(s, torch("2.10.0+cu128", "12.8"))), "kernels", PASS)


def test_mixed_gpus_all_native_pass_once():
    found = run_checks(facts(snap(gpu(0), gpu(1, RTX3090), gpu(2, H100)), torch()))
    f = one(found, "kernels", PASS)
    assert "3 GPU(s)" in f.title and not pick(found, "kernels", FAIL)


def test_ptx_only_warns_and_newer_ptx_than_driver_fails():
    custom = torch("2.6.0a0+git", "12.4", archs=("sm_80", "compute_80"))
    found = run_checks(facts(snap(gpu(0, H100)), custom))
    f = one(found, "kernels", WARN)
    assert "only PTX" in f.title
    newer = torch("2.6.0a0+git", "12.6", archs=("sm_80", "compute_80"))
    f = one(run_checks(facts(snap(gpu(0, H100)), newer)), "kernels", FAIL)
    assert "cannot JIT" in f.title


def test_unknown_arch_list_skips():
    custom = torch("2.6.0a0+gitabc", "12.6", archs=None)
    custom = TorchBuild(installed=True, version="2.6.0a0+gitabc", cuda="12.6", arch_list=None)
    assert one(run_checks(facts(snap(gpu(0)), custom)), "kernels", SKIP)


@pytest.mark.parametrize(
    "arch, cc, how",
    [
        ("sm_80", (8, 6), "cubin"),
        ("sm_86", (8, 0), None),
        ("sm_80", (9, 0), None),
        ("compute_80", (9, 0), "ptx"),
        ("compute_90", (8, 6), None),
        ("sm_90a", (9, 0), "cubin"),
        ("sm_90a", (9, 1), None),
        ("compute_90a", (10, 0), None),
        ("sm_100f", (10, 3), "cubin"),
        ("sm_120", (12, 1), "cubin"),
        ("sm_100", (11, 0), None),
        ("bogus", (8, 0), None),
    ],
)
def test_arch_rules(arch, cc, how):
    assert cuda_compat.arch_runs_on(arch, cc) == how


def test_wheel_table_matches_published_lists():
    def archs(variant: str, version: tuple[int, ...]) -> tuple[str, ...]:
        w = cuda_compat.wheel_archs(variant, version)
        assert w is not None, (variant, version)
        return w.archs

    assert "sm_120" not in archs("cu126", (2, 11))
    assert {"sm_100", "sm_120"} <= set(archs("cu128", (2, 8)))
    assert "sm_70" in archs("cu128", (2, 10)) and "sm_70" not in archs("cu128", (2, 11))
    assert "compute_120" in archs("cu130", (2, 9)) and "sm_70" not in archs("cu130", (2, 9))
    assert cuda_compat.wheel_archs("cu121", (2, 11)) is None  # no longer published
    assert cuda_compat.variant_of("2.6.0+cu126", "12.6") == "cu126"
    assert cuda_compat.variant_of("2.6.0a0+git", "12.4") == "cu124"


# -- CUDA_VISIBLE_DEVICES ----------------------------------------------------------------


def test_visible_unset_passes_with_mapping():
    f = one(run_checks(facts(snap(gpu(0), gpu(1)))), "visible", PASS)
    assert "2 device" in f.title and "cuda:1=GPU 1" in f.saw


def test_visible_duplicate_index_fails():
    found = run_checks(facts(snap(gpu(0), gpu(1)), env={"CUDA_VISIBLE_DEVICES": "0,0"}))
    f = pick(found, "visible", FAIL)
    assert f and "0,0" in f[0].title
    assert exit_code(found) == 1


def test_visible_ambiguous_uuid_prefix_fails():
    a = gpu(0, uuid="GPU-ab120000-0000-0000-0000-000000000000")
    b = gpu(1, uuid="GPU-ab340000-0000-0000-0000-000000000000")
    found = run_checks(facts(snap(a, b), env={"CUDA_VISIBLE_DEVICES": "GPU-ab"}))
    f = pick(found, "visible", FAIL)
    assert f and "GPU-ab" in f[0].title


def test_visible_index_out_of_range_fails_and_fix_keeps_what_cuda_keeps():
    found = run_checks(facts(snap(gpu(0), gpu(1)), env={"CUDA_VISIBLE_DEVICES": "1,7"}))
    f = pick(found, "visible", FAIL)
    assert f and "7" in f[0].title
    assert gpu(1).uuid in f[0].fix


def test_visible_empty_value_hides_every_gpu():
    found = run_checks(facts(snap(gpu(0)), env={"CUDA_VISIBLE_DEVICES": ""}))
    f = one(found, "visible", WARN)
    assert "hides every GPU" in f.title and "unset CUDA_VISIBLE_DEVICES" in f.fix


def test_heterogeneous_without_pci_bus_id_warns_and_with_it_passes():
    s = snap(gpu(0, RTX3090), gpu(1, A100))
    f = one(run_checks(facts(s)), "visible", WARN)
    assert f.fix == "export CUDA_DEVICE_ORDER=PCI_BUS_ID"
    assert one(run_checks(facts(s, env={"CUDA_DEVICE_ORDER": "PCI_BUS_ID"})), "visible", PASS)


def test_visible_without_gpus_is_informational():
    assert one(run_checks(facts(snap(), env={"CUDA_VISIBLE_DEVICES": "0"})), "visible", INFO)


# -- distributed -------------------------------------------------------------------------


def test_master_addr_without_world_size_fails():
    env = {"MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29500", "RANK": "0"}
    f = one(run_checks(facts(snap(gpu(0)), torch(), env)), "distributed", FAIL)
    assert "WORLD_SIZE" in f.title and "torchrun" in f.fix


@pytest.mark.parametrize(
    "env, needle",
    [
        ({"RANK": "4", "WORLD_SIZE": "4"}, "RANK=4"),
        ({"RANK": "x", "WORLD_SIZE": "4"}, "not an integer"),
        ({"MASTER_PORT": "70000"}, "not a TCP port"),
        ({"LOCAL_RANK": "2"}, "only 2 GPU(s) are visible"),
        (
            {"LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "8", "WORLD_SIZE": "4", "RANK": "0"},
            "LOCAL_WORLD_SIZE=8",
        ),
        ({"WORLD_SIZE": "0"}, "WORLD_SIZE=0"),
    ],
)
def test_distributed_inconsistencies_fail(env, needle):
    base = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500", "RANK": "0", "WORLD_SIZE": "1"}
    if "LOCAL_RANK" in env and len(env) == 1:
        base = {}
    found = run_checks(facts(snap(gpu(0), gpu(1)), torch(), {**base, **env}))
    fails = pick(found, "distributed", FAIL)
    assert any(needle in f.title for f in fails), fails


def test_distributed_consistent_passes_and_absent_skips():
    env = {
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": "29500",
        "RANK": "1",
        "WORLD_SIZE": "2",
        "LOCAL_RANK": "1",
        "LOCAL_WORLD_SIZE": "2",
    }
    assert one(run_checks(facts(snap(gpu(0), gpu(1)), torch(), env)), "distributed", PASS)
    assert one(run_checks(facts(snap(gpu(0)), torch())), "distributed", SKIP)


def test_local_rank_greater_than_rank_warns():
    env = {
        "MASTER_ADDR": "a",
        "MASTER_PORT": "1",
        "RANK": "0",
        "WORLD_SIZE": "2",
        "LOCAL_RANK": "1",
    }
    assert one(run_checks(facts(snap(gpu(0), gpu(1)), torch(), env)), "distributed", WARN)


def test_nccl_backend_levels():
    s = snap(gpu(0))
    assert one(run_checks(facts(s, torch())), "distributed.backend", PASS)
    assert one(run_checks(facts(s, torch(nccl=False))), "distributed.backend", WARN)
    win = one(run_checks(facts(s, torch(), platform="win32")), "distributed.backend", INFO)
    assert "gloo" in win.fix
    cpu = one(run_checks(facts(s, CPU_TORCH)), "distributed.backend", INFO)
    assert "gloo" in cpu.title
    unknown = torch(nccl=None)
    assert one(run_checks(facts(s, unknown)), "distributed.backend", SKIP)


# -- the machine -------------------------------------------------------------------------


def test_uncorrected_ecc_fails_and_suggests_drain():
    bad = gpu(1, ecc_uncorrected_volatile=3)
    found = run_checks(facts(snap(gpu(0), bad)))
    f = one(found, "machine.health", FAIL)
    assert "GPU 1" in f.title and "ECC" in f.title
    assert "gpuwarden drain 1" in f.fix
    assert f.gpu == bad.uuid


def test_drained_gpu_is_reported_with_undrain_fix():
    g = gpu(2)
    d = Drain(uuid=g.uuid, reason="fan noise", by="alice", at=0.0)
    found = run_checks(facts(snap(gpu(0), g), drains={g.uuid: d}))
    f = one(found, "machine.drain", INFO)
    assert "fan noise" in f.saw and f.fix.startswith("gpuwarden undrain 2")


def test_full_memory_without_processes_warns():
    hidden = gpu(0, memory_used=79 * GIB)
    seen = gpu(1, memory_used=79 * GIB, processes=(GpuProcess(pid=42, used_memory=79 * GIB),))
    found = run_checks(facts(snap(hidden, seen)))
    f = one(found, "machine.memory", WARN)
    assert f.gpu == hidden.uuid and "another PID namespace" in f.fix


def test_persistence_off_is_info_only():
    found = run_checks(facts(snap(gpu(0, persistence_mode=False))))
    f = one(found, "machine.persistence", INFO)
    assert "nvidia-smi -pm 1" in f.fix
    assert one(found, "machine", PASS)
    assert exit_code(found) == 0


def test_no_gpus_no_machine_findings():
    assert not [f for f in run_checks(facts(snap())) if f.check.startswith("machine")]


# -- in-process --------------------------------------------------------------------------


def _proc_facts(runtime, env, initial, gpus=None) -> Facts:
    return facts(
        snap(*(gpus or (gpu(0), gpu(1)))),
        torch(),
        env,
        in_process=True,
        runtime=runtime,
        initial_environ=initial,
    )


def test_in_process_cuda_initialised_before_variable_changed():
    rt = TorchRuntime(
        cuda_initialized=True, device_uuids=(gpu(0).uuid, gpu(1).uuid), device_count=2
    )
    found = run_checks(_proc_facts(rt, {"CUDA_VISIBLE_DEVICES": "1"}, {}))
    f = one(found, "in-process", WARN)
    assert "initialised before" in f.title and "before `import torch`" in f.fix


def test_in_process_cuda_initialised_with_matching_devices_passes():
    rt = TorchRuntime(cuda_initialized=True, device_uuids=(gpu(1).uuid,), device_count=1)
    env = {"CUDA_VISIBLE_DEVICES": "1"}
    assert one(run_checks(_proc_facts(rt, env, env)), "in-process", PASS)


def test_in_process_count_mismatch_when_uuids_unknown():
    rt = TorchRuntime(cuda_initialized=True, device_uuids=None, device_count=2)
    found = run_checks(_proc_facts(rt, {"CUDA_VISIBLE_DEVICES": "0"}, {}))
    assert one(found, "in-process", WARN)


def test_in_process_torch_imported_then_variable_changed():
    rt = TorchRuntime(cuda_initialized=False)
    found = run_checks(
        _proc_facts(rt, {"CUDA_VISIBLE_DEVICES": "1"}, {"CUDA_VISIBLE_DEVICES": "0"})
    )
    f = one(found, "in-process", WARN)
    assert "after torch was imported" in f.title


def test_in_process_without_torch_passes_and_cli_mode_has_no_such_check():
    assert one(run_checks(_proc_facts(None, {}, {})), "in-process", PASS)
    assert not pick(run_checks(facts(snap(gpu(0)))), "in-process")


def test_install_line_replaces_an_installed_torch_and_plainly_installs_a_missing_one() -> None:
    from gpuwarden.doctor.cuda_compat import install_command

    assert install_command("cu124", "2.13.0+cpu").startswith(
        "pip install --force-reinstall 'torch==2.13.0' --index-url "
    )
    missing = install_command("cu124", None)
    assert missing.startswith("pip install torch --index-url ")
    assert "--force-reinstall" not in missing


def test_private_leases_on_a_machine_others_use_are_a_warning() -> None:
    busy = gpu(0, processes=(GpuProcess(pid=7, used_memory=2**30, user="alice"),))
    found = run_checks(
        facts(
            snap(busy, gpu(1)),
            user="bob",
            lease_dir="/home/bob/.local/state/gpuwarden/leases",
            lease_dir_shared=False,
        )
    )
    finding = one(found, "machine.sharing", WARN)
    assert "private to bob" in finding.title and "alice" in finding.saw
    assert "install -d -m 1777 /var/lib/gpuwarden/leases" in finding.fix


def test_private_leases_alone_on_the_machine_are_only_information() -> None:
    mine = gpu(0, processes=(GpuProcess(pid=7, used_memory=2**30, user="bob"),))
    found = run_checks(facts(snap(mine), user="bob", lease_dir="/x", lease_dir_shared=False))
    one(found, "machine.sharing", INFO)


@pytest.mark.parametrize("shared", [True, None])
def test_shared_or_unknown_lease_dir_says_nothing(shared: Optional[bool]) -> None:
    busy = gpu(0, processes=(GpuProcess(pid=7, used_memory=2**30, user="alice"),))
    found = run_checks(facts(snap(busy), user="bob", lease_dir="/x", lease_dir_shared=shared))
    assert pick(found, "machine.sharing") == []


def test_a_report_names_its_problems_and_renders_itself():
    """Report lives beside the renderer it calls (no import back from findings)."""
    from gpuwarden.doctor.report import Report

    found = (
        Finding("driver", PASS, "fine"),
        Finding("torch.build", WARN, "old build", fix="pip install -U torch"),
        Finding("kernels", FAIL, "no kernel image"),
    )
    rep = Report(found, facts(snap(gpu(0))))
    assert [f.level for f in rep.problems()] == [WARN, FAIL]
    assert not rep.ok
    text = rep.text()
    assert "old build" in text and "no kernel image" in text
