"""`@record` against `@dataclass(frozen=True)`: the same class both ways must behave alike."""

from __future__ import annotations

import dataclasses
import inspect
import pickle
from typing import Any, Optional

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpuwarden.base.records import record
from gpuwarden.machine.inventory import Gpu, GpuProcess, Snapshot


def both(body: str) -> tuple[type, type]:
    """The class defined by `body`, made once by dataclasses and once by record."""
    made = []
    for decorate in (dataclasses.dataclass(frozen=True), record):
        namespace: dict[str, Any] = {"field": dataclasses.field, "Optional": Optional}
        exec(f"class Point:\n    '''A point.'''\n{body}", namespace)
        made.append(decorate(namespace["Point"]))
    return made[0], made[1]


BODY = """
    x: int
    y: int = 0
    tags: tuple = ()
    note: Optional[str] = field(default=None, compare=False, repr=False)
    seen: list = field(default_factory=list, hash=False, compare=False)
"""
STOCK, RECORD = both(BODY)

CALLS: list[tuple[tuple[Any, ...], dict[str, Any]]] = [
    ((1,), {}),
    ((1, 2), {}),
    ((1,), {"y": 5, "tags": ("a",)}),
    ((), {"x": 3, "note": "n"}),
    ((1, 2, ("t",), "n", [1]), {}),
    ((), {}),  # missing x
    ((1, 2, (), None, [], 9), {}),  # too many
    ((1,), {"x": 2}),  # twice
    ((1,), {"z": 2}),  # unknown
]


@pytest.mark.parametrize("args, kwargs", CALLS)
def test_construction_matches_or_fails_alike(args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    try:
        expected = STOCK(*args, **kwargs)
    except TypeError:
        with pytest.raises(TypeError):
            RECORD(*args, **kwargs)
        return
    got = RECORD(*args, **kwargs)
    assert dataclasses.asdict(got) == dataclasses.asdict(expected)
    assert repr(got) == repr(expected)
    assert hash(got) == hash(expected)


values = st.integers(-3, 3)
notes = st.none() | st.text(max_size=2)


@given(values, values, notes, values, values, notes)
def test_equality_and_hash_follow_the_compared_fields(
    x1: int, y1: int, n1: Optional[str], x2: int, y2: int, n2: Optional[str]
) -> None:
    stock = STOCK(x1, y1, note=n1) == STOCK(x2, y2, note=n2)
    assert (RECORD(x1, y1, note=n1) == RECORD(x2, y2, note=n2)) is stock
    if stock:
        assert hash(RECORD(x1, y1, note=n1)) == hash(RECORD(x2, y2, note=n2))
    assert RECORD(x1) != STOCK(x1)  # another class is never equal, as with dataclasses


def test_it_is_a_frozen_dataclass() -> None:
    point = RECORD(1)
    assert dataclasses.is_dataclass(point)
    assert [f.name for f in dataclasses.fields(point)] == ["x", "y", "tags", "note", "seen"]
    assert dataclasses.replace(point, y=7) == RECORD(1, 7)
    with pytest.raises(dataclasses.FrozenInstanceError):
        point.x = 2  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        del point.x  # type: ignore[misc]
    assert RECORD(1).seen is not RECORD(1).seen  # a fresh default each time


def test_signature_is_the_fields() -> None:
    assert str(inspect.signature(RECORD)) == str(inspect.signature(STOCK))
    assert str(inspect.signature(Gpu)).startswith("(index: 'int', uuid: 'str', name: ")


def test_refuses_what_it_does_not_do() -> None:
    class WithPostInit:
        x: int

        def __post_init__(self) -> None:
            pass

    with pytest.raises(TypeError, match="__post_init__"):
        record(WithPostInit)


def test_recursive_repr_does_not_recurse() -> None:
    holder = RECORD(1, seen=[])
    holder.seen.append(holder)
    assert repr(holder) == "Point(x=1, y=0, tags=(), seen=[...])"


def test_gpuwarden_snapshots_are_records() -> None:
    gpu = Gpu(index=0, uuid="GPU-1", processes=(GpuProcess(pid=1, used_memory=None),))
    snap = Snapshot(taken_at=1.0, hostname="h", gpus=(gpu,))
    assert snap == Snapshot(taken_at=1.0, hostname="h", gpus=(gpu,), topology={(0, 1): 10})
    assert repr(gpu).startswith("Gpu(index=0, uuid='GPU-1', name=None,")
    assert {gpu, dataclasses.replace(gpu)} == {gpu}
    assert pickle.loads(pickle.dumps(snap)) == snap


def test_frozen_alike_down_to_the_messages_and_subclasses() -> None:
    for made in (STOCK, RECORD):
        assert made.__dataclass_params__.frozen is True  # type: ignore[attr-defined]
    messages = []
    for point in (STOCK(1), RECORD(1)):
        for change in (lambda p: setattr(p, "x", 2), lambda p: delattr(p, "y")):
            with pytest.raises(dataclasses.FrozenInstanceError) as caught:
                change(point)
            messages.append(str(caught.value))
        with pytest.raises(dataclasses.FrozenInstanceError):
            point.other = 1  # any attribute, as on a frozen dataclass
    assert messages[:2] == messages[2:]
    for base in (STOCK, RECORD):
        with pytest.raises(TypeError, match="non-frozen"):
            dataclasses.dataclass(type("Sub", (base,), {"__annotations__": {"z": int}}))
        plain = type("Plain", (base,), {})(1)  # a plain subclass may add attributes
        plain.extra = 5
        assert plain.extra == 5
        with pytest.raises(dataclasses.FrozenInstanceError):
            plain.x = 2


def test_a_record_without_a_docstring_is_refused() -> None:
    # dataclasses would make one with `inspect`, which then weighs on every start-up.
    class Bare:
        x: int

    with pytest.raises(TypeError, match="docstring"):
        record(Bare)
