"""Property tests: `gpuwarden.placement.visible` against a small reference model of CUDA's rules.

The reference below is deliberately written differently from the module (a
regular expression, no messages, no early helpers) and short enough to check
by eye against docs/cuda-visible-devices.md.
"""

from __future__ import annotations

import re
from typing import Optional

from hypothesis import given, settings
from hypothesis import strategies as st

from gpuwarden.jobs.launch import export_env
from gpuwarden.machine.inventory import Gpu, Snapshot
from gpuwarden.placement.visible import PCI_BUS_ID, cuda_order, parse, resolve

_LEADING_INT = re.compile(r"[+-]?[0-9]+")


def reference(value: Optional[str], uuids: list[str], migs: list[str]) -> list[int]:
    if value is None:
        return list(range(len(uuids)))
    if value == "":
        return []
    seen: list[int] = []
    for raw in value.split(","):
        entry = raw.strip(" \t\n\v\f\r")
        if entry.startswith("GPU-"):
            hits = [i for i, u in enumerate(uuids) if u.startswith(entry)]
        elif entry.startswith("MIG-"):
            hits = [len(uuids) + j for j, u in enumerate(migs) if u.startswith(entry)]
        else:
            m = _LEADING_INT.match(entry)
            hits = [int(m.group())] if m and 0 <= int(m.group()) < len(uuids) else []
        if len(hits) != 1:  # not a device, unknown, ambiguous, negative, out of range
            break
        if hits[0] in seen:  # a duplicate empties everything
            return []
        seen.append(hits[0])
    return seen


# Short hex over a tiny alphabet so that prefixes are often shared (ambiguous).
hexes = st.text(alphabet="ab01", min_size=1, max_size=5)
uuid_lists = st.lists(hexes, max_size=6, unique=True).map(lambda hs: [f"GPU-{h}" for h in hs])
mig_lists = st.lists(hexes, max_size=3, unique=True).map(lambda hs: [f"MIG-{h}" for h in hs])
spaces = st.text(alphabet=" \t", max_size=2)


@st.composite
def entries(draw, uuids: list[str], migs: list[str]) -> str:
    kind = draw(st.sampled_from(["int", "int", "uuid", "mig", "junk"]))
    if kind == "int":
        sign = draw(st.sampled_from(["", "", "+", "-"]))
        body = f"{sign}{draw(st.integers(0, 8))}{draw(st.sampled_from(['', '', 'x', '.5', 'a1']))}"
    elif kind in ("uuid", "mig"):
        pool = (uuids if kind == "uuid" else migs) or ["GPU-none"]
        full = draw(st.sampled_from(pool))
        body = full[: draw(st.integers(4, len(full)))]
    else:
        body = draw(st.text(alphabet="0123456789+-GPUMI ab\t,", max_size=6))
    return draw(spaces) + body + draw(spaces)


@st.composite
def machines_and_values(draw):
    uuids = draw(uuid_lists)
    migs = draw(mig_lists)
    if draw(st.integers(0, 9)) == 0:
        value = draw(st.one_of(st.none(), st.just(""), st.text(max_size=12)))
    else:
        value = ",".join(draw(st.lists(entries(uuids, migs), min_size=1, max_size=6)))
    return uuids, migs, value


@settings(max_examples=400, deadline=None)
@given(machines_and_values())
def test_parse_agrees_with_the_reference_model(case):
    uuids, migs, value = case
    assert list(parse(value, uuids, migs).ordinals) == reference(value, uuids, migs)


@settings(max_examples=300, deadline=None)
@given(machines_and_values())
def test_parse_invariants(case):
    uuids, migs, value = case
    parsed = parse(value, uuids, migs)
    assert len(set(parsed.ordinals)) == len(parsed.ordinals)  # never a device twice
    assert all(0 <= o < len(uuids) + len(migs) for o in parsed.ordinals)
    if parsed.duplicate:
        assert parsed.ordinals == () and parsed.problems
    if parsed.stopped_at is not None:
        assert parsed.problems  # every stop is explained
    elif value:
        assert len(parsed.ordinals) == value.count(",") + 1  # every entry became a device


@settings(max_examples=200, deadline=None)
@given(machines_and_values(), st.text(alphabet="0,x- ", max_size=6))
def test_what_follows_a_stop_never_matters(case, tail):
    uuids, migs, value = case
    parsed = parse(value, uuids, migs)
    if value and parsed.stopped_at is not None and not parsed.duplicate:
        assert parse(value + "," + tail, uuids, migs).ordinals == parsed.ordinals


ccs = st.one_of(st.none(), st.tuples(st.integers(5, 9), st.integers(0, 9)))


@st.composite
def machines(draw) -> tuple[Gpu, ...]:
    n = draw(st.integers(0, 8))
    caps = draw(st.lists(ccs, min_size=n, max_size=n))
    gpus = [
        Gpu(index=i, uuid=f"GPU-{i:02d}{draw(hexes)}", name=f"model{cc}", compute_capability=cc)
        for i, cc in enumerate(caps)
    ]
    return tuple(draw(st.permutations(gpus)))


@settings(max_examples=200, deadline=None)
@given(machines(), st.sampled_from([None, "FASTEST_FIRST", "PCI_BUS_ID", "bogus"]))
def test_cuda_order_is_a_permutation_with_the_documented_ranking(gpus, order):
    ordered = cuda_order(gpus, order)
    assert sorted(g.index for g in ordered) == sorted(g.index for g in gpus)
    if order == "PCI_BUS_ID":
        assert [g.index for g in ordered] == sorted(g.index for g in gpus)
        return
    keys = [(g.compute_capability or (-1, -1), -g.index) for g in ordered]
    assert keys == sorted(keys, reverse=True)  # newest first, ties in PCI order


@settings(max_examples=200, deadline=None)
@given(machines(), st.data(), st.booleans())
def test_exported_value_round_trips_through_resolve(gpus, data, use_uuid):
    chosen = data.draw(st.permutations(gpus)).__getitem__(
        slice(0, data.draw(st.integers(0, len(gpus))))
    )
    res = resolve(Snapshot(0.0, "h", gpus=gpus), export_env(chosen, use_uuid))
    assert [d.uuid for d in res.devices] == [g.uuid for g in chosen]
    assert [d.cuda_index for d in res.devices] == list(range(len(chosen)))
    assert res.problems == ()
    assert res.device_order == PCI_BUS_ID
