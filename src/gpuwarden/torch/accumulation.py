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

import contextlib
from collections.abc import Iterable, Iterator
from typing import Any, TypeVar

from gpuwarden.errors import UserError

T = TypeVar("T")


class MicroStep:
    """One micro-batch: its place in the group, the loss divisor, the no_sync context."""

    def __init__(
        self, model: Any, index: int, divisor: int, last: bool, correction: float = 1.0
    ) -> None:
        self.model = model
        self.index = index
        self.divisor = divisor
        self.last = last
        self.correction = correction  # grads *= this after a short group's last backward
        self._ctx: Any = None

    def scale(self, loss: Any) -> Any:
        """The micro-batch's mean loss as its share of the group's mean loss."""
        return loss / self.divisor

    def __enter__(self) -> MicroStep:
        sync_off = getattr(self.model, "no_sync", None)
        self._ctx = sync_off() if (sync_off and not self.last) else contextlib.nullcontext()
        self._ctx.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._ctx.__exit__(*exc)
        if self.last and self.correction != 1.0 and exc[0] is None and self.model is not None:
            for p in self.model.parameters():
                if p.grad is not None:
                    p.grad.mul_(self.correction)


def accumulate(
    batches: Iterable[T], every: int, model: Any = None
) -> Iterator[tuple[T, MicroStep]]:
    """Yield `(batch, MicroStep)`; `micro.last` marks where the optimizer should step."""
    if every < 1:
        raise UserError(f"accumulate: every={every}; it must be at least 1")
    try:
        total: int | None = len(batches)  # type: ignore[arg-type]
    except TypeError:
        total = None
    if total is not None:
        for i, batch in enumerate(batches):
            start = i - i % every
            size = min(every, total - start)
            yield batch, MicroStep(model, i - start, size, i - start == size - 1)
        return
    it = iter(batches)
    pending = next(it, _END)
    index = 0
    while pending is not _END:
        batch, pending = pending, next(it, _END)
        last = index == every - 1 or pending is _END
        correction = every / (index + 1) if last else 1.0
        yield batch, MicroStep(model, index, every, last, correction)  # type: ignore[misc]
        index = 0 if last else index + 1


_END: Any = object()
