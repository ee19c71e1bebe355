"""Invariants of `choose()` on random machines, leases and drains (hypothesis)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from gpuwarden.health.drain import Drain
from gpuwarden.health.judgement import FATAL, judge, level
from gpuwarden.leases import LeaseInfo
from gpuwarden.machine.inventory import Gpu, Snapshot
from gpuwarden.placement.request import Request
from gpuwarden.placement.selection import choose

GiB = 2**30
MODELS = ("NVIDIA A100-SXM4-80GB", "NVIDIA RTX A6000", "Tesla V100-SXM2-32GB")


@st.composite
def gpu(draw: st.DrawFn, index: int) -> Gpu:
    total = draw(st.sampled_from([16, 32, 48, 80])) * GiB
    used = draw(st.integers(0, total))
    return Gpu(
        index=index,
        uuid=f"GPU-{index:04d}-{draw(st.integers(0, 99)):02d}",
        name=draw(st.sampled_from(MODELS)),
        memory_total=total,
        memory_used=used,
        memory_free=draw(st.one_of(st.none(), st.just(total - used))),
        utilization_gpu=draw(st.one_of(st.none(), st.integers(0, 100))),
        compute_capability=draw(st.sampled_from([(7, 0), (8, 0), (8, 6), (9, 0)])),
        lost=draw(st.integers(0, 9)) == 0,
        ecc_uncorrected_volatile=draw(st.sampled_from([None, 0, 0, 0, 3])),
    )


@st.composite
def world(draw: st.DrawFn):
    n = draw(st.integers(0, 9))
    gpus = tuple(draw(gpu(i)) for i in range(n))
    topology = {
        (a, b): draw(st.sampled_from([10, 20, 30, 40, 50]))
        for a in range(n)
        for b in range(a + 1, n)
        if draw(st.booleans())
    }
    nvlinks = {key: 4 for key in topology if draw(st.integers(0, 3)) == 0}
    snap = Snapshot(0.0, "h", gpus, topology=topology, nvlinks=nvlinks)
    leases = [
        LeaseInfo(
            g.uuid, "u", 1000 + g.index, "c", 0.0, draw(st.sampled_from([None, GiB, 8 * GiB]))
        )
        for g in gpus
        if draw(st.integers(0, 3)) == 0
    ]
    drains = {g.uuid: Drain(g.uuid, "r", "a", 0.0) for g in gpus if draw(st.integers(0, 4)) == 0}
    request = Request(
        count=draw(st.integers(0, 10)),
        min_free=draw(st.one_of(st.none(), st.sampled_from([GiB, 20 * GiB, 60 * GiB]))),
        max_util=draw(st.one_of(st.none(), st.sampled_from([10.0, 50.0]))),
        min_capability=draw(st.one_of(st.none(), st.just((8, 0)))),
        model=draw(st.one_of(st.none(), st.sampled_from(["a100", "*A6000*"]))),
        mem=draw(st.one_of(st.none(), st.sampled_from([GiB, 10 * GiB]))),
        keep_first_last=draw(st.booleans()),
    )
    return snap, leases, drains, request


@settings(max_examples=300, deadline=None)
@given(world())
def test_invariants(case) -> None:
    snap, leases, drains, request = case
    choice = choose(snap, request, leases, drains)
    assert choice == choose(snap, request, list(leases), dict(drains))  # deterministic
    chosen = {g.uuid for g in choice.gpus}
    if choice.error is None:
        assert len(choice.gpus) == request.count
        assert not choice.never_fits
    else:
        assert choice.gpus == ()
        assert "\n" not in choice.error
    assert [g.index for g in choice.gpus] == sorted(g.index for g in choice.gpus)
    assert set(choice.passed_over) == {g.uuid for g in snap.gpus} - chosen
    leased = {lease.uuid for lease in leases}
    exclusive = {lease.uuid for lease in leases if lease.mem is None}
    for g in choice.gpus:
        assert g.uuid not in drains
        assert not g.lost and level(judge(g)) != FATAL
        assert g.uuid not in exclusive
        if request.mem is None:
            assert g.uuid not in leased
        if request.min_free is not None:
            assert g.memory_free is not None and g.memory_free >= request.min_free
        if request.max_util is not None:
            assert g.utilization_gpu is not None and g.utilization_gpu <= request.max_util
    # never_fits is about the machine, not the moment: dropping leases and load keeps it.
    if choice.never_fits:
        idle = Snapshot(
            0.0,
            "h",
            tuple(
                Gpu(
                    **{
                        **g.__dict__,
                        "memory_used": 0,
                        "memory_free": g.memory_total,
                        "utilization_gpu": 0,
                    }
                )
                for g in snap.gpus
            ),
        )
        assert not choose(idle, request, [], drains).ok
    elif choice.error is not None:
        # ... and a request that is only blocked now can be served on an idle machine.
        idle_gpus = tuple(
            Gpu(
                **{
                    **g.__dict__,
                    "memory_used": 0,
                    "memory_free": g.memory_total,
                    "utilization_gpu": 0,
                }
            )
            for g in snap.gpus
        )
        assert choose(Snapshot(0.0, "h", idle_gpus), request, [], drains).ok
