"""CUDA_VISIBLE_DEVICES / CUDA_DEVICE_ORDER rules, one example per rule, on hand-built machines."""

from __future__ import annotations

import pytest

from gpuwarden.jobs.launch import export_env, export_value
from gpuwarden.machine.inventory import Gpu, MigInstance, Snapshot
from gpuwarden.placement.visible import (
    FASTEST_FIRST,
    PCI_BUS_ID,
    Parsed,
    cuda_order,
    effective_order,
    parse,
    resolve,
)

UUIDS = (
    "GPU-0a1b2c3d-0000-0000-0000-000000000000",
    "GPU-0a1b9999-0000-0000-0000-000000000001",
    "GPU-77f00d00-0000-0000-0000-000000000002",
    "GPU-e3e3e3e3-0000-0000-0000-000000000003",
)


def ords(value: str | None, uuids=UUIDS, mig=()) -> tuple[int, ...]:
    return parse(value, uuids, mig).ordinals


# --- parse: one test per rule ------------------------------------------------------------


def test_unset_means_every_device_in_order():
    assert parse(None, UUIDS) == Parsed((0, 1, 2, 3))


def test_empty_means_none_and_is_not_a_problem():
    assert parse("", UUIDS) == Parsed(())


def test_order_of_entries_is_cuda_order():
    assert ords("2,0") == (2, 0)


@pytest.mark.parametrize("value", [" 1 , 2 ", "\t1,\n2", "1 ,2", " 1,2 "])
def test_surrounding_whitespace_is_ignored(value):
    parsed = parse(value, UUIDS)
    assert parsed.ordinals == (1, 2)
    assert parsed.problems == ()


def test_leading_plus_is_accepted():
    parsed = parse("+1,+2", UUIDS)
    assert parsed.ordinals == (1, 2)
    assert parsed.problems == ()


@pytest.mark.parametrize(("value", "want"), [("1abc", (1,)), ("0x3", (0,)), ("2.9,1gpu", (2, 1))])
def test_junk_after_the_digits_is_ignored_but_reported(value, want):
    parsed = parse(value, UUIDS)
    assert parsed.ordinals == want
    assert parsed.stopped_at is None
    assert parsed.problems and "ignores what follows the digits" in parsed.problems[0]


def test_leading_zeros_are_not_junk():
    assert parse("01,002", UUIDS) == Parsed((1, 2))


def test_unicode_digits_are_not_digits():
    # C's strtoul reads ASCII only; Python's str.isdigit would accept these.
    assert ords("\u0661") == ()  # ARABIC-INDIC DIGIT ONE
    assert parse("1\u00b2", UUIDS).ordinals == (1,)  # superscript two is junk


def test_negative_entry_stops_reading_and_keeps_what_came_before():
    parsed = parse("0,2,-1,1", UUIDS)  # NVIDIA's own example
    assert parsed.ordinals == (0, 2)
    assert parsed.stopped_at == "-1"
    assert "negative" in parsed.problems[0]


def test_minus_zero_is_zero():
    assert ords("-0") == (0,)


@pytest.mark.parametrize("value", ["abc", "x,0", ",0", "+", "-", " "])
def test_invalid_first_entry_hides_everything(value):
    parsed = parse(value, UUIDS)
    assert parsed.ordinals == ()
    assert parsed.stopped_at is not None
    assert parsed.problems


def test_empty_entry_in_the_middle_stops_reading():
    parsed = parse("1,,2", UUIDS)
    assert parsed.ordinals == (1,)
    assert parsed.stopped_at == ""


def test_trailing_comma_keeps_the_list_but_is_reported():
    parsed = parse("1,2,", UUIDS)
    assert parsed.ordinals == (1, 2)
    assert "only the 2 entries before it count" in parsed.problems[0]


def test_duplicate_yields_no_device():
    parsed = parse("0,1,0", UUIDS)
    assert parsed.ordinals == ()
    assert parsed.duplicate
    assert "no GPU at all" in parsed.problems[0]


def test_duplicate_through_different_spellings():
    assert ords("1,+1") == ()
    assert ords(f"{UUIDS[2]},2") == ()
    assert ords("GPU-77,GPU-77f0") == ()


def test_duplicate_after_the_stop_is_not_seen():
    assert ords("0,-1,0") == (0,)
    assert ords("0,zz,0") == (0,)


def test_index_beyond_the_device_count_stops_reading():
    parsed = parse("1,4,2", UUIDS)
    assert parsed.ordinals == (1,)
    assert parsed.stopped_at == "4"
    assert "indices 0-3" in parsed.problems[0]


def test_out_of_range_then_duplicate_stops_at_the_range():
    # One pass, as the driver documents it; PyTorch's NVML count says 0 here
    # (docs/cuda-visible-devices.md), the acceptance script checks the driver.
    assert ords("0,9,0") == (0,)


def test_huge_index_is_out_of_range_not_an_overflow():
    assert ords("99999999999999999999999") == ()


def test_no_gpus_at_all():
    assert parse(None, ()) == Parsed(())
    assert parse("0", ()).ordinals == ()
    assert "no GPU" in parse("0", ()).problems[0]


def test_full_uuid():
    assert ords(UUIDS[3]) == (3,)


def test_unique_uuid_prefix():
    assert ords("GPU-77,GPU-e3") == (2, 3)


def test_ambiguous_uuid_prefix_stops_reading():
    parsed = parse("GPU-e3,GPU-0a1b", UUIDS)
    assert parsed.ordinals == (3,)
    assert parsed.stopped_at == "GPU-0a1b"
    assert "prefix of 2" in parsed.problems[0]


def test_unknown_uuid_stops_reading():
    parsed = parse("GPU-77,GPU-ffff,0", UUIDS)
    assert parsed.ordinals == (2,)
    assert "matches no GPU UUID" in parsed.problems[0]


def test_uuid_prefix_is_case_sensitive():
    assert ords("GPU-E3") == ()
    assert ords("gpu-e3") == ()


def test_uuid_entries_are_stripped():
    assert ords(" GPU-77 , GPU-e3 ") == (2, 3)


def test_indices_and_uuids_mix():
    assert ords("GPU-77,0") == (2, 0)
    assert ords("3,GPU-0a1b2") == (3, 0)


def test_mig_uuid_positions_follow_the_gpus():
    mig = ("MIG-aaaa-1", "MIG-bbbb-2")
    assert ords("MIG-bb", mig=mig) == (5,)
    assert ords("MIG-cc", mig=mig) == ()
    assert ords("MIG-", mig=mig) == ()  # ambiguous


def test_legacy_mig_form_is_reported():
    parsed = parse("MIG-GPU-77f00d00/1/0", UUIDS)
    assert parsed.ordinals == ()
    assert "R470" in parsed.problems[0]


# --- order --------------------------------------------------------------------------------


def gpu(index: int, cc=(8, 0), name="NVIDIA A100-SXM4-80GB", **kw) -> Gpu:
    return Gpu(index=index, uuid=f"GPU-{index:08x}-aaaa", name=name, compute_capability=cc, **kw)


MIXED = (
    gpu(0, (7, 0), "Tesla V100-SXM2-32GB"),
    gpu(1, (8, 0)),
    gpu(2, (9, 0), "NVIDIA H100 80GB HBM3"),
    gpu(3, (8, 0)),
)


def snap(*gpus: Gpu) -> Snapshot:
    return Snapshot(taken_at=0.0, hostname="test", gpus=tuple(gpus))


def test_pci_bus_id_is_nvml_order():
    shuffled = (MIXED[2], MIXED[0], MIXED[3], MIXED[1])
    assert [g.index for g in cuda_order(shuffled, PCI_BUS_ID)] == [0, 1, 2, 3]


def test_fastest_first_model_newest_first_ties_in_pci_order():
    assert [g.index for g in cuda_order(MIXED, None)] == [2, 1, 3, 0]
    assert [g.index for g in cuda_order(MIXED, FASTEST_FIRST)] == [2, 1, 3, 0]


def test_unknown_capability_sorts_last():
    gpus = (gpu(0, None), gpu(1, (6, 1)))
    assert [g.index for g in cuda_order(gpus, None)] == [1, 0]


def test_invalid_order_falls_back_to_default():
    assert effective_order("pci_bus_id") == FASTEST_FIRST
    assert effective_order("BOGUS") == FASTEST_FIRST
    assert [g.index for g in cuda_order(MIXED, "BOGUS")] == [2, 1, 3, 0]


# --- resolve -------------------------------------------------------------------------------


def env(**kw: str) -> dict[str, str]:
    return {"CUDA_" + k: v for k, v in kw.items()}


def test_resolve_unset_identical_gpus_no_warning():
    res = resolve(snap(gpu(0), gpu(1)), {})
    assert [(d.cuda_index, d.index) for d in res.devices] == [(0, 0), (1, 1)]
    assert res.warnings == () and res.problems == ()
    assert res.value is None and res.device_order == FASTEST_FIRST


def test_resolve_indices_count_in_cuda_order_under_the_default():
    res = resolve(snap(*MIXED), env(VISIBLE_DEVICES="0"))
    assert [d.index for d in res.devices] == [2]  # cuda 0 = the H100, not nvidia-smi's 0
    assert any("differ" in w and "PCI_BUS_ID" in w for w in res.warnings)


def test_resolve_pci_bus_id_matches_nvidia_smi_and_is_quiet():
    res = resolve(snap(*MIXED), env(VISIBLE_DEVICES="3,0", DEVICE_ORDER="PCI_BUS_ID"))
    assert [(d.cuda_index, d.index, d.name) for d in res.devices] == [
        (0, 3, "NVIDIA A100-SXM4-80GB"),
        (1, 0, "Tesla V100-SXM2-32GB"),
    ]
    assert res.warnings == ()
    assert res.cuda_index(MIXED[0].uuid) == 1
    assert res.cuda_index(MIXED[1].uuid) is None


def test_resolve_uuids_do_not_depend_on_order():
    value = f"{MIXED[0].uuid},{MIXED[3].uuid}"
    for order in ("PCI_BUS_ID", "FASTEST_FIRST"):
        res = resolve(snap(*MIXED), env(VISIBLE_DEVICES=value, DEVICE_ORDER=order))
        assert [d.index for d in res.devices] == [0, 3]


def test_resolve_invalid_order_warns_and_falls_back():
    res = resolve(snap(gpu(0), gpu(1)), env(DEVICE_ORDER="PCI"))
    assert res.device_order == FASTEST_FIRST
    assert any("'PCI'" in w and "FASTEST_FIRST" in w for w in res.warnings)


def test_resolve_reports_problems_with_the_value():
    res = resolve(snap(gpu(0), gpu(1)), env(VISIBLE_DEVICES="1,x,0"))
    assert [d.index for d in res.devices] == [1]
    assert res.stopped_at == "x"
    assert res.problems and "'1,x,0'" in res.problems[0]


def test_resolve_duplicate_hides_all():
    res = resolve(snap(gpu(0), gpu(1)), env(VISIBLE_DEVICES="1,1"))
    assert res.devices == ()
    assert res.problems


def test_resolve_no_driver():
    res = resolve(Snapshot(0.0, "h", error="no NVIDIA driver found"), {})
    assert res.devices == () and res.problems == ()


def test_resolve_reads_os_environ_by_default(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    monkeypatch.setenv("CUDA_DEVICE_ORDER", "PCI_BUS_ID")
    assert [d.index for d in resolve(snap(*MIXED)).devices] == [1]


def test_resolve_lost_gpu_is_warned_about():
    res = resolve(snap(gpu(0), gpu(1, lost=True)), env(DEVICE_ORDER="PCI_BUS_ID"))
    assert any("GPU 1" in w and "lost" in w for w in res.warnings)


# --- MIG ---------------------------------------------------------------------------------------

MIG_A = MigInstance(uuid="MIG-1111aaaa-0000", index=0, name="3g.40gb")
MIG_B = MigInstance(uuid="MIG-2222bbbb-0000", index=1, name="1g.10gb")
MIG_GPU = gpu(1, mig_mode=True, mig_instances=(MIG_B, MIG_A))  # out of order on purpose
MIG_MACHINE = snap(gpu(0), MIG_GPU, gpu(2))
PCI = {"CUDA_DEVICE_ORDER": "PCI_BUS_ID"}


def test_mig_uuid_selects_that_mig_device():
    res = resolve(MIG_MACHINE, {**PCI, "CUDA_VISIBLE_DEVICES": "MIG-2222"})
    (dev,) = res.devices
    assert (dev.cuda_index, dev.index, dev.uuid, dev.mig_uuid) == (0, 1, MIG_GPU.uuid, MIG_B.uuid)
    assert dev.name == "NVIDIA A100-SXM4-80GB MIG 1g.10gb"
    assert res.warnings == ()


def test_only_one_mig_device_and_no_other_gpu_once_mig_is_used():
    value = f"0,{MIG_B.uuid},{MIG_A.uuid},2"
    res = resolve(MIG_MACHINE, {**PCI, "CUDA_VISIBLE_DEVICES": value})
    assert [d.mig_uuid for d in res.devices] == [MIG_B.uuid]
    (warning,) = res.warnings
    assert "only one MIG device" in warning
    assert "GPU 0, 2;" in warning and MIG_A.uuid in warning


def test_unset_with_mig_exposes_the_first_mig_device_only():
    res = resolve(MIG_MACHINE, PCI)
    assert [d.mig_uuid for d in res.devices] == [MIG_A.uuid]  # MIG index order
    assert any("only one MIG device" in w for w in res.warnings)


def test_mig_gpu_named_as_a_whole_is_warned_about():
    res = resolve(MIG_MACHINE, {**PCI, "CUDA_VISIBLE_DEVICES": "1"})
    assert [d.mig_uuid for d in res.devices] == [MIG_A.uuid]
    assert any("not documented" in w for w in res.warnings)


def test_mig_gpu_without_instances_is_unusable():
    empty = gpu(0, mig_mode=True)
    res = resolve(snap(empty, gpu(1)), {**PCI, "CUDA_VISIBLE_DEVICES": "0,1"})
    assert [d.index for d in res.devices] == [1]
    assert any("no MIG devices" in w for w in res.warnings)


def test_mig_instances_of_a_gpu_with_mig_off_are_ignored():
    stale = gpu(0, mig_mode=False, mig_instances=(MIG_A,))
    res = resolve(snap(stale), {"CUDA_VISIBLE_DEVICES": "MIG-1111"})
    assert res.devices == () and res.problems


# --- export ------------------------------------------------------------------------------------


def test_export_indices_and_uuids():
    gpus = (MIXED[3], MIXED[0])
    assert export_value(gpus) == "3,0"
    assert export_value(gpus, use_uuid=True) == f"{MIXED[3].uuid},{MIXED[0].uuid}"
    assert export_value(()) == ""
    assert export_env(gpus) == {"CUDA_VISIBLE_DEVICES": "3,0", "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}


def test_export_refuses_a_duplicate():
    with pytest.raises(ValueError, match="twice"):
        export_value((MIXED[1], MIXED[1]))


def test_exported_value_resolves_to_exactly_those_gpus():
    gpus = (MIXED[3], MIXED[0])
    for use_uuid in (False, True):
        res = resolve(snap(*MIXED), export_env(gpus, use_uuid))
        assert [d.uuid for d in res.devices] == [g.uuid for g in gpus]
        assert res.warnings == () and res.problems == ()


# --- the command, on the simulated machines ---------------------------------------------------


def test_cli_json_on_server(sim, cli):
    import json

    sim("server-8xa100")
    proc = cli(
        "visible",
        "--json",
        env={"CUDA_VISIBLE_DEVICES": "GPU-814e,5", "CUDA_DEVICE_ORDER": "PCI_BUS_ID"},
    )
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert data["schema"] == "gpuwarden.placement.visible/1"
    assert [(d["cuda_index"], d["index"]) for d in data["devices"]] == [(0, 2), (1, 5)]
    assert set(data["devices"][0]) == {"cuda_index", "index", "uuid", "name", "mig_uuid"}
    assert data["devices"][0]["uuid"].startswith("GPU-814e")
    assert data["problems"] == [] and data["warnings"] == []


def test_cli_mixed_default_order_warns_and_maps_fastest_first(sim, cli):
    import json

    sim("mixed")
    proc = cli("visible", "--json", env={"CUDA_VISIBLE_DEVICES": "2,0"})
    data = json.loads(proc.stdout)
    assert proc.returncode == 0
    # In the model's order (A6000 8.6, A100 8.0, T4 7.5, V100 7.0) CUDA's 2 is the T4,
    # nvidia-smi's GPU 0, and CUDA's 0 the RTX A6000, nvidia-smi's GPU 2.
    assert [d["index"] for d in data["devices"]] == [0, 2]
    assert any("PCI_BUS_ID" in w for w in data["warnings"])


def test_cli_malformed_value_shows_what_survives_and_exits_0(sim, cli):
    sim("server-8xa100")
    env = {"CUDA_VISIBLE_DEVICES": "3,oops,4", "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}
    proc = cli("visible", env=env)
    assert proc.returncode == 0
    assert "cuda:0" in proc.stdout and "cuda:1" not in proc.stdout
    assert "problem:" in proc.stdout and "'oops'" in proc.stdout
    assert "Traceback" not in proc.stderr
    strict = cli("visible", "--check", env=env)
    assert strict.returncode == 1
    fine = cli("visible", "--check", env={"CUDA_VISIBLE_DEVICES": "3"})
    assert fine.returncode == 0


def test_cli_duplicate_shows_no_gpu(sim, cli):
    sim("workstation-3x3090")
    proc = cli("visible", env={"CUDA_VISIBLE_DEVICES": "0,0"})
    assert "no GPU is visible to CUDA" in proc.stdout
    assert "twice" in proc.stdout


def test_cli_no_driver(sim, cli):
    import json

    sim("laptop-none")
    proc = cli("visible")
    assert proc.returncode == 0
    assert "CPU only" in proc.stdout and "CPU only; CPU only" not in proc.stdout
    data = json.loads(cli("visible", "--json").stdout)
    assert data["devices"] == [] and data["error"]
