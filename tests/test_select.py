"""Selection policy on hand-built snapshots: filters, ranking, reasons, impossible requests."""

from __future__ import annotations

import pytest

from gpuwarden.base.errors import UserError
from gpuwarden.health.drain import Drain
from gpuwarden.leases import LeaseInfo
from gpuwarden.machine.inventory import TOPOLOGY_SINGLE, TOPOLOGY_SYSTEM, Gpu, GpuProcess, Snapshot
from gpuwarden.placement.request import Request
from gpuwarden.placement.selection import choose, resolve_ids
from machines import card, snapshot

GiB = 2**30


def eight(**kw: object) -> Snapshot:
    return snapshot(*(card(i, **kw) for i in range(8)))


def idx(choice) -> list[int]:
    return [g.index for g in choice.gpus]


def lease(gpu: Gpu, mem: int | None = None, user: str = "bob", pid: int = 4242) -> LeaseInfo:
    return LeaseInfo(gpu.uuid, user, pid, "python train.py", 0.0, mem)


def drained(gpu: Gpu, reason: str = "XID 79 fell off the bus") -> Drain:
    return Drain(gpu.uuid, reason, "alice", 0.0)


def test_gpu0_is_kept_for_last_and_most_free_memory_wins() -> None:
    snap = snapshot(card(0), card(1, memory_free=40 * GiB, memory_used=40 * GiB), card(2))
    choice = choose(snap, Request(count=1))
    assert idx(choice) == [2]
    assert choice.passed_over[snap.gpus[0].uuid].startswith("kept for last")
    assert idx(choose(snap, Request(count=1, keep_first_last=False))) == [0]
    assert idx(choose(snap, Request(count=3))) == [0, 1, 2]


def test_lower_utilization_breaks_ties() -> None:
    snap = snapshot(card(0), card(1, utilization_gpu=30), card(2, utilization_gpu=10))
    assert idx(choose(snap, Request(count=1, max_util=50))) == [2]


def test_every_gpu_not_chosen_has_a_reason() -> None:
    snap = eight()
    g = snap.gpus
    choice = choose(
        snap,
        Request(count=1, min_free=20 * GiB, exclude=("7",)),
        leases=[lease(g[1])],
        drains={g[3].uuid: drained(g[3])},
    )
    assert len(choice.gpus) == 1
    assert set(choice.passed_over) | {choice.gpus[0].uuid} == {x.uuid for x in g}
    assert choice.passed_over[g[1].uuid] == "leased by bob pid 4242"
    assert choice.passed_over[g[3].uuid] == "drained by alice: XID 79 fell off the bus"
    assert choice.passed_over[g[7].uuid] == "excluded"


def test_filter_reasons() -> None:
    snap = snapshot(
        card(0),
        card(1, memory_free=3 * GiB, memory_used=77 * GiB),
        card(2, utilization_gpu=95),
        card(3, compute_capability=(7, 0), name="Tesla V100-SXM2-32GB"),
        card(4, lost=True),
        card(5, ecc_uncorrected_volatile=2),
        card(6, memory_free=None, utilization_gpu=None),
    )
    g = snap.gpus
    choice = choose(snap, Request(count=1, min_free=20 * GiB, max_util=50))
    assert idx(choice) == [3]  # GPU 0 is kept for last
    why = choice.passed_over
    assert why[g[1].uuid] == "only 3072MiB free < 20.0GiB"
    assert why[g[2].uuid] == "util 95% > 50%"
    assert why[g[4].uuid].startswith("unhealthy: GPU is lost")
    assert why[g[5].uuid].startswith("unhealthy: 2 uncorrected ECC errors")
    assert why[g[6].uuid] == "free memory n/a"
    why = choose(snap, Request(count=1, min_capability=(8, 0))).passed_over
    assert why[g[3].uuid] == "compute capability 7.0 < 8.0"
    why = choose(snap, Request(count=1, model="a100")).passed_over
    assert why[g[3].uuid] == "model Tesla V100-SXM2-32GB does not match 'a100'"
    assert idx(choose(snap, Request(count=1, model="*v100*"))) == [3]
    assert idx(choose(snap, Request(count=1, model="v100"))) == [3]


def test_exclusive_request_respects_unleased_processes_unless_asked() -> None:
    colleague = GpuProcess(pid=99, used_memory=30 * GiB, user="carol", command="python train.py")
    snap = snapshot(card(1, processes=(colleague,), memory_used=30 * GiB, memory_free=50 * GiB))
    choice = choose(snap, Request(count=1))
    assert choice.error and not choice.never_fits
    assert "busy: pid 99 (carol) uses 30.0GiB" in choice.error
    assert "--max-util or --gpus accepts them" in choice.error
    # Free memory alone does not make a GPU someone computes on fair game ...
    assert not choose(snap, Request(count=1, min_free=40 * GiB)).ok
    # ... accepting a load, naming the GPU or asking for a share does.
    assert idx(choose(snap, Request(count=1, max_util=100))) == [1]
    assert idx(choose(snap, Request(gpus=("1",)))) == [1]
    assert idx(choose(snap, Request(count=1, mem=GiB))) == [1]
    # Graphics contexts (a desktop) do not make a GPU busy.
    xorg = GpuProcess(pid=7, used_memory=GiB, kind="graphics")
    assert idx(choose(snapshot(card(1, processes=(xorg,))), Request(count=1))) == [1]


def test_min_free_passes_over_a_colleagues_gpu_for_an_idle_one() -> None:
    # The README's `lease(n=2, min_free="20GiB")`: bob's 12 GiB job leaves 68 GiB free,
    # but an idle GPU (even one with a health warning) is taken before his.
    from gpuwarden.health import judgement

    bob = GpuProcess(pid=77, used_memory=12 * GiB, user="bob", command="python train.py")
    snap = snapshot(
        card(0, memory_free=0, memory_used=80 * GiB),
        card(4, processes=(bob,), memory_used=12 * GiB, memory_free=68 * GiB),
        card(6),
        card(7),
    )
    remap = {snap.gpus[2].uuid: (judgement.Symptom(judgement.WARNING, "remap pending"),)}
    choice = choose(snap, Request(count=2, min_free=20 * GiB), health=remap)
    assert idx(choice) == [6, 7]
    assert choice.passed_over[snap.gpus[1].uuid] == "busy: pid 77 (bob) uses 12.0GiB"
    choice = choose(snap, Request(count=1, min_free=20 * GiB), health=remap)
    assert idx(choice) == [7]
    assert choice.passed_over[snap.gpus[2].uuid] == (
        "ranked after GPUs without health warnings (remap pending)"
    )
    assert set(choice.passed_over) == {g.uuid for g in snap.gpus} - {snap.gpus[3].uuid}


def test_shared_requests_fit_by_declared_memory_plus_others_use() -> None:
    base = card(1, memory_used=30 * GiB, memory_free=50 * GiB)
    snap = snapshot(base)
    # 30 GiB used: 20 declared by a shared lease plus 10 from a process gpuwarden did not start.
    shares = [lease(base, mem=20 * GiB)]
    assert idx(choose(snap, Request(count=1, mem=50 * GiB), leases=shares)) == [1]
    choice = choose(snap, Request(count=1, mem=51 * GiB), leases=shares)
    assert not choice.ok and not choice.never_fits
    assert "no room for 51.0GiB: 20.0GiB declared by 1 shared lease + 10.0GiB used by others" in (
        choice.error or ""
    )
    # An exclusive request never takes a GPU with any lease; a shared one never one with an
    # exclusive lease.
    assert not choose(snap, Request(count=1), leases=shares).ok
    assert choose(snap, Request(count=1, mem=GiB), leases=[lease(base)]).passed_over[base.uuid] == (
        "leased by bob pid 4242"
    )
    # More than the card holds can never fit.
    choice = choose(snap, Request(count=1, mem=100 * GiB))
    assert choice.never_fits


def test_impossible_counts_never_fit_with_a_clear_reason() -> None:
    snap = eight()
    g = snap.gpus
    choice = choose(snap, Request(count=9))
    assert choice.never_fits
    assert choice.error == "asked for 9 GPUs but this machine has only 8 GPUs"
    choice = choose(snap, Request(count=8), drains=[drained(g[3])])
    assert choice.never_fits
    assert choice.error == (
        "asked for 8 GPUs but only 7 are healthy and not drained "
        "(GPU 3 drained by alice: XID 79 fell off the bus)"
    )
    choice = choose(snap, Request(count=1, min_free=100 * GiB))
    assert choice.never_fits
    assert "none is suitable for this request (GPUs 0,1,2,3,4,5,6,7 only 80.0GiB in total" in (
        choice.error or ""
    )
    # Leased GPUs free up eventually: not "never".
    choice = choose(snap, Request(count=8), leases=[lease(g[5])])
    assert not choice.never_fits
    assert choice.error == "asked for 8 GPUs but only 7 are free now (GPU 5 leased by bob pid 4242)"
    assert choose(snapshot(), Request(count=1)).never_fits


def test_count_zero_chooses_nothing() -> None:
    choice = choose(eight(), Request(count=0))
    assert choice.ok and choice.gpus == ()
    with pytest.raises(UserError, match="invalid GPU count -1"):
        choose(eight(), Request(count=-1))


def test_explicit_gpus_by_index_and_uuid_prefix() -> None:
    snap = eight()
    g = snap.gpus
    assert idx(choose(snap, Request(gpus=("5", "2")))) == [2, 5]
    assert idx(choose(snap, Request(gpus=(g[4].uuid[:7],)))) == [4]
    assert idx(choose(snap, Request(gpus=(g[4].uuid[:6].lower(),)))) == [4]
    # All digits is an index, never a UUID prefix.
    with pytest.raises(UserError, match="unknown GPU '44'"):
        choose(snap, Request(gpus=("44",)))
    # With a count, the named GPUs are the candidates.
    choice = choose(snap, Request(count=1, gpus=("0", "6")))
    assert idx(choice) == [6]
    assert choice.passed_over[g[1].uuid] == "not among the requested GPUs"
    choice = choose(snap, Request(count=3, gpus=("0", "6")))
    assert choice.never_fits and choice.error == "asked for 3 GPUs but only 2 were named"
    choice = choose(snap, Request(gpus=("1", "3")), drains=[drained(g[3])])
    assert choice.never_fits and "GPU 3 drained by alice" in (choice.error or "")


def test_unknown_and_ambiguous_ids() -> None:
    snap = snapshot(card(0, uuid="GPU-abc1"), card(1, uuid="GPU-abc2"), card(2, uuid="GPU-def"))
    with pytest.raises(UserError, match=r"unknown GPU '9': this machine has GPUs 0-2"):
        choose(snap, Request(gpus=("9",)))
    with pytest.raises(
        UserError, match=r"GPU ID 'abc' is ambiguous: it matches GPU 0 \(GPU-abc1\)"
    ):
        resolve_ids(snap, ["abc"])
    with pytest.raises(UserError, match="unknown GPU 'GPU-zz'"):
        choose(snap, Request(count=1, exclude=("GPU-zz",)))
    assert [g.index for g in resolve_ids(snap, ["def", "0", "GPU-DEF"])] == [2, 0]


def test_allowed_restricts_to_the_parent_set() -> None:
    snap = eight()
    g = snap.gpus
    allowed = {g[2].uuid, g[3].uuid}
    choice = choose(snap, Request(count=2), allowed=allowed)
    assert idx(choice) == [2, 3]
    assert choice.passed_over[g[5].uuid].startswith("not visible")
    choice = choose(snap, Request(count=3), allowed=allowed)
    assert choice.never_fits
    assert choice.error == (
        "asked for 3 GPUs but the parent CUDA_VISIBLE_DEVICES leaves only 2 GPUs visible"
    )
    with pytest.raises(UserError, match="GPU 5 is not visible here"):
        choose(snap, Request(gpus=("5",)), allowed=allowed)


def test_multi_gpu_prefers_nvlink_then_same_switch_over_more_free_memory() -> None:
    gpus = [card(i, memory_free=(80 - i) * GiB, memory_used=i * GiB) for i in range(8)]
    topo = {(a, b): TOPOLOGY_SYSTEM for a in range(8) for b in range(a + 1, 8)}
    topo[(5, 6)] = TOPOLOGY_SINGLE
    snap = snapshot(*gpus, topology=topo)
    assert idx(choose(snap, Request(count=2))) == [5, 6]
    snap = snapshot(*gpus, topology=topo, nvlinks={(3, 7): 12})
    assert idx(choose(snap, Request(count=2))) == [3, 7]
    # Without topology, the best-ranked GPUs win (GPU 0 last).
    assert idx(choose(snapshot(*gpus), Request(count=2))) == [1, 2]


def test_multi_gpu_prefers_one_model() -> None:
    snap = snapshot(
        card(0),
        card(1, name="NVIDIA RTX A6000"),
        card(2, memory_free=70 * GiB, memory_used=10 * GiB),
        card(3, name="NVIDIA RTX A6000", memory_free=60 * GiB, memory_used=20 * GiB),
    )
    assert idx(choose(snap, Request(count=2))) == [1, 3]
    assert idx(choose(snap, Request(count=1))) == [1]


def test_health_warnings_rank_after_healthy() -> None:
    from gpuwarden.health import judgement

    snap = snapshot(card(0), card(1), card(2, memory_free=10 * GiB, memory_used=70 * GiB))
    hot = {snap.gpus[1].uuid: (judgement.Symptom(judgement.WARNING, "hot"),)}
    assert idx(choose(snap, Request(count=1), health=hot)) == [2]


def test_a_recorded_fatal_xid_is_judged_as_status_judges_it() -> None:
    # The XID exists only in the log the health watch keeps: the snapshot alone looks fine.
    # Every command passes choose() the health judged with that log (xidlog.judged).
    from gpuwarden.health import xidlog

    def judged(request: Request):  # type: ignore[no-untyped-def]
        return choose(snap, request, health=xidlog.judged(snap.gpus))

    snap = snapshot(card(1), card(2, memory_free=10 * GiB, memory_used=70 * GiB))
    xidlog.record_xid(snap.gpus[0].uuid, 79, index=1)
    assert idx(choose(snap, Request(count=1))) == [1]  # the pure call: no log read
    choice = judged(Request(count=1))
    assert idx(choice) == [2]
    assert choice.passed_over[snap.gpus[0].uuid].startswith("unhealthy: XID 79")
    assert judged(Request(count=2)).never_fits
    xidlog.clear_xids([snap.gpus[0].uuid])
    assert idx(judged(Request(count=1))) == [1]
    xidlog.record_xid(snap.gpus[0].uuid, 13, index=1)  # a warning: ranked after healthy
    assert idx(judged(Request(count=1))) == [2]


def test_the_configured_fatal_list_is_the_one_status_uses(monkeypatch) -> None:
    from gpuwarden.health import xidlog

    snap = snapshot(card(1), card(2, memory_free=10 * GiB, memory_used=70 * GiB))
    xidlog.record_xid(snap.gpus[1].uuid, 13, index=2)
    monkeypatch.setenv("GPUWARDEN_HEALTH_FATAL_XIDS", "+13")
    choice = choose(snap, Request(count=2), health=xidlog.judged(snap.gpus))
    assert choice.never_fits and "GPU 2 unhealthy: XID 13" in (choice.error or "")


def test_request_from_config(monkeypatch: pytest.MonkeyPatch) -> None:
    from gpuwarden import config

    monkeypatch.setenv("GPU_IDS", "1,2")
    cfg = config.load({"run.min_free": "1GiB", "run.min_capability": "8.0"})
    req = Request.from_config(cfg, mem=5)
    assert req == Request(count=None, gpus=("1", "2"), min_free=GiB, min_capability=(8, 0), mem=5)


def test_a_mig_gpu_is_chosen_by_mig_device() -> None:
    from gpuwarden.machine.inventory import MigInstance
    from gpuwarden.placement.selection import devices

    slices = (
        MigInstance("MIG-aa", 0, name="3g.40gb", memory_total=40 * GiB, memory_used=20 * GiB),
        MigInstance("MIG-bb", 1, name="2g.20gb", memory_total=20 * GiB, memory_used=0),
    )
    grace = GpuProcess(pid=5, used_memory=20 * GiB, user="grace", mig_uuid="MIG-aa")
    a100 = card(3, mig_mode=True, mig_instances=slices, processes=(grace,), utilization_gpu=None)
    alice = GpuProcess(pid=4, used_memory=80 * GiB, user="alice")
    snap = snapshot(card(1, memory_free=0, memory_used=80 * GiB, processes=(alice,)), a100)
    units = devices(snap)
    assert [g.uuid for g in units] == [snap.gpus[0].uuid, "MIG-aa", "MIG-bb"]
    assert units[1].processes == (grace,) and units[2].processes == ()
    assert (units[2].memory_free, units[2].utilization_gpu) == (20 * GiB, 0.0)
    choice = choose(snap, Request(count=1))
    assert [g.uuid for g in choice.gpus] == ["MIG-bb"]
    assert choice.passed_over["MIG-aa"].startswith("busy: pid 5 (grace)")
    assert [g.uuid for g in choose(snap, Request(gpus=("MIG-a",), max_util=100)).gpus] == ["MIG-aa"]
    assert choose(snap, Request(count=2)).passed_over["MIG-bb"] == (
        "MIG device: CUDA shows a process one MIG device only"
    )
    # The parent's drain and whole-GPU lease apply to its MIG devices.
    assert not choose(snap, Request(count=1), drains=[drained(a100)]).ok
    assert not choose(snap, Request(count=1), leases=[lease(a100)]).ok
    with pytest.raises(UserError, match=r"GPU 3 is in MIG mode.*MIG-aa"):
        choose(snap, Request(gpus=("3",)))
    assert not choose(snap, Request(count=1, exclude=("3",))).ok
