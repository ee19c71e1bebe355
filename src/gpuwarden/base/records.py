"""`@record`: a frozen dataclass whose methods are shared instead of compiled per class.

For each class, `dataclasses.dataclass(frozen=True)` writes `__init__`, `__repr__`,
`__eq__`, `__hash__` and two frozen guards as source text and compiles them
while the module is imported, for every record `gpuwarden run` needs before it
can start a job: a large part of what `run` adds to every job's start
(docs/performance.md). A record is still a real frozen dataclass
(`dataclasses.fields`, `replace`, `asdict` and `is_dataclass` work, assigning to a
field raises `FrozenInstanceError`, `inspect.signature` shows the fields), and
behaves as `@dataclass(frozen=True)` does — tests/test_records.py holds the two
side by side — but those six methods are shared ones that walk the class's
field list: making a class is cheaper, building an instance a little dearer
(the figures are in docs/performance.md). Every snapshot and value type in
gpuwarden is a record.

Not supported, because no record needs them: `kw_only` fields and `__post_init__`
(refused when the class is made) and `InitVar` (refused when an instance is).
"""

from __future__ import annotations

from reprlib import recursive_repr

from gpuwarden.base.lazyimport import import_dataclasses

TYPE_CHECKING = False  # typing stays off the start-up path; annotations need it only here
if TYPE_CHECKING:
    import dataclasses
else:
    dataclasses = import_dataclasses()  # without `inspect` and `copy` where that saves time
# What modules on the start-up path use beside `@record`, taken from here so that
# `dataclasses` is always imported the cheap way (gpuwarden.base.lazyimport).
field = dataclasses.field
replace = dataclasses.replace
asdict = dataclasses.asdict
fields = dataclasses.fields

if TYPE_CHECKING:
    from typing import Any, TypeVar

    from typing_extensions import dataclass_transform

    T = TypeVar("T")

_MISSING = dataclasses.MISSING


def _init(self: Any, *args: Any, **kwargs: Any) -> None:
    cls = type(self)
    plan = cls.__record_plan__  # (name, default, default_factory) per init field
    if len(args) > len(plan):
        raise TypeError(
            f"{cls.__qualname__}.__init__() takes {len(plan) + 1} positional arguments "
            f"but {len(args) + 1} were given"
        )
    # Straight into the instance's dict, as a frozen dataclass's own __init__ does
    # through object.__setattr__, one call per field fewer.
    values = self.__dict__
    for (name, _, _), value in zip(plan, args):
        values[name] = value
    missing = []
    for name, default, factory in plan[len(args) :]:
        if name in kwargs:
            values[name] = kwargs.pop(name)
        elif default is not _MISSING:
            values[name] = default
        elif factory is not _MISSING:
            values[name] = factory()
        else:
            missing.append(repr(name))
    if kwargs:
        name = next(iter(kwargs))
        if any(name == given for given, _, _ in plan[: len(args)]):
            raise TypeError(f"{cls.__qualname__}.__init__() got multiple values for {name!r}")
        raise TypeError(
            f"{cls.__qualname__}.__init__() got an unexpected keyword argument {name!r}"
        )
    if missing:
        raise TypeError(
            f"{cls.__qualname__}.__init__() missing {len(missing)} required argument(s): "
            + ", ".join(missing)
        )


@recursive_repr()
def _repr(self: Any) -> str:
    parts = ", ".join(f"{name}={getattr(self, name)!r}" for name in self.__record_repr__)
    return f"{type(self).__qualname__}({parts})"


def _eq(self: Any, other: Any) -> Any:
    if other.__class__ is not self.__class__:
        return NotImplemented
    names = self.__record_compare__
    return tuple(getattr(self, n) for n in names) == tuple(getattr(other, n) for n in names)


def _hash(self: Any) -> int:
    return hash(tuple(getattr(self, n) for n in self.__record_hash__))


def _setattr(self: Any, name: str, value: Any) -> None:
    cls = type(self)
    if "__record_init__" in cls.__dict__ or name in cls.__dataclass_fields__:
        raise dataclasses.FrozenInstanceError(f"cannot assign to field {name!r}")
    object.__setattr__(self, name, value)


def _delattr(self: Any, name: str) -> None:
    cls = type(self)
    if "__record_init__" in cls.__dict__ or name in cls.__dataclass_fields__:
        raise dataclasses.FrozenInstanceError(f"cannot delete field {name!r}")
    object.__delattr__(self, name)


class _Factory:
    def __repr__(self) -> str:  # how dataclasses' signatures show a default_factory
        return "<factory>"


class _Signature:
    """`inspect.signature(RecordClass)`: the fields, as dataclasses' own `__init__` has them."""

    def __get__(self, instance: Any, owner: type) -> Any:
        if instance is not None:
            raise AttributeError("__signature__")
        import inspect

        def default(f: dataclasses.Field[Any]) -> Any:
            if f.default is not _MISSING:
                return f.default
            return inspect.Parameter.empty if f.default_factory is _MISSING else _Factory()

        kind = inspect.Parameter.POSITIONAL_OR_KEYWORD
        parameters = [
            inspect.Parameter(f.name, kind, default=default(f), annotation=f.type)
            for f in owner.__record_init__  # type: ignore[attr-defined]
        ]
        return inspect.Signature(parameters, return_annotation=None)


_SHARED = {
    "__init__": _init,
    "__repr__": _repr,
    "__eq__": _eq,
    "__hash__": _hash,
    "__signature__": _Signature(),
    "__setattr__": _setattr,
    "__delattr__": _delattr,
}


def _record(cls: type[T]) -> type[T]:
    """Make `cls` a frozen dataclass with the shared methods above (a method the class
    writes itself stays)."""
    if hasattr(cls, "__post_init__"):
        raise TypeError(f"{cls.__qualname__}: a record has no __post_init__")
    if cls.__doc__ is None:  # dataclasses would write one with `inspect`, slow to import
        raise TypeError(f"{cls.__qualname__}: a record says what it is in a docstring")
    if "__setattr__" in cls.__dict__ or "__delattr__" in cls.__dict__:
        raise TypeError(f"{cls.__qualname__}: a record is frozen; it has no __setattr__")
    # Made as a plain dataclass, then frozen by the shared guards: `frozen=True` would
    # compile two guard methods per class (most of the cost of making one).
    made: Any = dataclasses.dataclass(init=False, repr=False, eq=False)(cls)
    for name, method in _SHARED.items():
        if name not in cls.__dict__:
            setattr(cls, name, method)
    made.__dataclass_params__.frozen = True  # as a frozen dataclass says, for subclasses
    fields = dataclasses.fields(made)
    if any(getattr(f, "kw_only", False) is True for f in fields):  # 3.10+
        raise TypeError(f"{cls.__qualname__}: a record has no keyword-only fields")
    # The shared methods read these; a class of any shape gets them, hence `made: Any`.
    made.__record_init__ = tuple(f for f in fields if f.init)
    made.__record_plan__ = tuple((f.name, f.default, f.default_factory) for f in fields if f.init)
    made.__record_repr__ = tuple(f.name for f in fields if f.repr)
    made.__record_compare__ = tuple(f.name for f in fields if f.compare)
    hashed = (f for f in fields if (f.compare if f.hash is None else f.hash))
    made.__record_hash__ = tuple(f.name for f in hashed)
    return cls


if TYPE_CHECKING:
    # Type checkers read a record's fields as they read a dataclass's; they see the
    # decorator only on a definition, not on a reassignment.
    @dataclass_transform(frozen_default=True, field_specifiers=(dataclasses.field,))
    def record(cls: type[T]) -> type[T]:
        return _record(cls)

else:
    record = _record
