"""Gradient accumulation over K micro-batches, correct at the edges.

The seeds' loop (`loss / K`, step when `(i + 1) % K == 0`) has three faults this
fixes: under DDP every micro-batch all-reduces its gradients although only the
last one's result is used (`no_sync` skips the others); a final group shorter
than K is divided by K, so its step is too small, or, worse, its gradients are
never stepped and leak into the next epoch; and the step happens on a counter
the caller must keep in sync by hand.

    for batch, micro in accumulate(loader, every=4, model=model):
        with micro:                      # no_sync() unless this is the group's last
            amp.backward(micro.scale(loss_fn(model(x), y)))
        if micro.last:
            amp.step()

With a sized iterable (a DataLoader) the divisor of a short final group is known
in advance. Otherwise the group is divided by K and, when it turns out short,
its gradients are multiplied by K/n before the step, which is the same up to
float rounding.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any, TypeVar

from gpuwarden.base.errors import UserError

T = TypeVar("T")
_LOOK_UP: Any = object()


class MicroStep:
    """One micro-batch: its place in the group, the loss divisor, the no_sync context."""

    __slots__ = ("_ctx", "_sync_off", "correction", "divisor", "index", "last", "model")

    def __init__(
        self,
        model: Any,
        index: int,
        divisor: int,
        last: bool,
        correction: float = 1.0,
        sync_off: Any = _LOOK_UP,
    ) -> None:
        self.model = model
        self.index = index
        self.divisor = divisor
        self.last = last
        self.correction = correction  # grads *= this after a short group's last backward
        # accumulate() looks `no_sync` up once per loop, not once per micro-batch (on a
        # plain Module a missing attribute costs a raised and caught AttributeError).
        if sync_off is _LOOK_UP:
            sync_off = getattr(model, "no_sync", None)
        self._sync_off = None if last else sync_off
        self._ctx: Any = None

    def scale(self, loss: Any) -> Any:
        """The micro-batch's mean loss as its share of the group's mean loss."""
        return loss / self.divisor

    def __enter__(self) -> MicroStep:
        if self._sync_off is not None:
            self._ctx = self._sync_off()
            self._ctx.__enter__()
        return self

    def __exit__(self, kind: Any, value: Any, tb: Any) -> None:
        if self._ctx is not None:
            ctx, self._ctx = self._ctx, None
            ctx.__exit__(kind, value, tb)
        if self.correction != 1.0 and self.last and kind is None and self.model is not None:
            for p in self.model.parameters():
                if p.grad is not None:
                    p.grad.mul_(self.correction)


def accumulate(
    batches: Iterable[T], every: int, model: Any = None
) -> Iterator[tuple[T, MicroStep]]:
    """Yield `(batch, MicroStep)`; `micro.last` marks where the optimizer should step."""
    if every < 1:
        raise UserError(f"accumulate: every={every}; it must be at least 1")
    sync_off = getattr(model, "no_sync", None)
    try:
        total: int | None = len(batches)  # type: ignore[arg-type]
    except TypeError:
        total = None
    if total is not None:
        start, size = 0, min(every, total)
        for i, batch in enumerate(batches):
            if i - start == every:
                start, size = i, min(every, total - i)
            index = i - start
            yield batch, MicroStep(model, index, size, index == size - 1, 1.0, sync_off)
        return
    it = iter(batches)
    pending = next(it, _END)
    index = 0
    while pending is not _END:
        batch, pending = pending, next(it, _END)
        last = index == every - 1 or pending is _END
        correction = every / (index + 1) if last else 1.0
        yield batch, MicroStep(model, index, every, last, correction, sync_off)  # type: ignore[misc]
        index = 0 if last else index + 1


_END: Any = object()
