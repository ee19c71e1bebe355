"""Mixed precision chosen from the hardware, and one optimizer step that is safe with it.

`decide()` is the pure policy: bf16 autocast where the GPU computes bf16 natively
(compute capability >= 8.0: Ampere, Hopper, ...), fp16 autocast with a gradient
scaler on Volta/Turing (7.x) where bf16 is emulated, fp32 on older GPUs and on CPU
(CPU bf16 only when asked: it is slower than fp32 on CPUs without AMX/AVX512-BF16).

`AmpStep` is the step the seeds spell out by hand, plus the two parts they leave
out: unscaling before clipping (clipping scaled gradients clips at the wrong
norm) and skipping the update when a gradient is inf/NaN, with or without a
scaler, so one bad batch cannot poison the weights.
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Any

from gpuwarden.base.errors import UserError
from gpuwarden.base.records import record

if TYPE_CHECKING:
    import torch

REQUESTS = ("auto", "fp32", "bf16", "fp16")
# nullcontext keeps no state, so one instance serves every fp32 step (and nests).
_NO_AUTOCAST = contextlib.nullcontext()


@record
class Precision:
    """The policy's answer for one device: `with p.autocast():` and `p.make_scaler()`.

    One record serves both as the pure decision (compared in tests) and as the
    thing a training loop uses: each class made at import is paid by every
    training script.
    """

    name: str  # "fp32" | "bf16" | "fp16"
    device_type: str
    scaler: bool

    @property
    def dtype(self) -> torch.dtype:
        import torch

        return {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[self.name]

    def autocast(self) -> Any:
        """Autocast for the forward pass and loss (a no-op context for fp32)."""
        if self.name == "fp32":
            return _NO_AUTOCAST
        import torch

        return torch.autocast(self.device_type, dtype=self.dtype)

    def make_scaler(self) -> Any:
        """A `torch.amp.GradScaler` when this precision needs one, else None."""
        if not self.scaler:
            return None
        import torch

        return torch.amp.GradScaler(self.device_type)


def decide(
    device_type: str, capability: tuple[int, int] | None, request: str = "auto"
) -> Precision:
    """The precision for a request on a device (capability: CUDA's (major, minor), else None)."""
    request = request.lower()
    if request not in REQUESTS:
        raise UserError(f"precision {request!r}: choose one of {', '.join(REQUESTS)}")
    if request == "fp32":
        return Precision("fp32", device_type, False)
    if device_type == "cuda":
        major = (capability or (0, 0))[0]
        if request == "auto":
            if major >= 8:
                return Precision("bf16", device_type, False)
            if major == 7:
                return Precision("fp16", device_type, True)
            # Pascal and older: no tensor cores, fp16 gains nothing
            return Precision("fp32", device_type, False)
        if request == "bf16" and major < 8:
            cc = ".".join(map(str, capability or (0, 0)))
            raise UserError(
                f"bf16 needs compute capability 8.0 or newer; this GPU is {cc}: use fp16 or auto"
            )
        return Precision(request, device_type, request == "fp16")
    if request == "auto":
        return Precision("fp32", device_type, False)
    # bf16 has fp32's exponent range, so it never needs loss scaling; fp16 always does.
    return Precision(request, device_type, request == "fp16")


def precision(request: str = "auto", dev: torch.device | None = None) -> Precision:
    """Decide precision for `dev` (default: `device()`); GPUWARDEN_PRECISION overrides auto."""
    import os

    from gpuwarden.torch.devices import device as pick_device

    if request == "auto":
        request = os.environ.get("GPUWARDEN_PRECISION", "auto") or "auto"
    dev = pick_device() if dev is None else dev
    capability = None
    if dev.type == "cuda":
        import torch

        capability = tuple(torch.cuda.get_device_capability(dev))
    return decide(dev.type, capability, request)  # type: ignore[arg-type]


class AmpStep:
    """backward with scaling, then unscale, optional clip, inf/NaN check, step, update.

    `step()` returns False when it skipped the update because a gradient was not
    finite; `skipped` counts those. Its `state_dict()` carries the scaler's state,
    so a Checkpointer can save it in place of the scaler.

    Without a scaler the check is GradScaler's own fused kernel with a scale of 1:
    one call per (device, dtype) bucket and one read of a flag per device each
    step. What the step does per parameter in Python is gathered once and again
    only when the optimizer's param groups change or the parameters move device,
    so the check costs what its kernel costs. Clearing the gradients sets them to
    None directly, which is all `zero_grad(set_to_none=True)` does, without its
    per-call profiler scope and compiler guard (a few microseconds a step: about
    what the check itself costs on a small CPU model); an optimizer that
    overrides `zero_grad`, or a running profiler, gets the real call.
    """

    def __init__(
        self,
        optimizer: torch.optim.Optimizer,
        prec: Precision | None = None,
        *,
        clip: float | None = None,
        scaler: Any = None,
        zero_grad: bool = True,
    ) -> None:
        import torch

        self.optimizer = optimizer
        self.precision = prec
        self.scaler = scaler if scaler is not None else (prec.make_scaler() if prec else None)
        self.clip = clip
        self.zero_grad = zero_grad
        self.skipped = 0
        self._check = torch._amp_foreach_non_finite_check_and_unscale_
        self._profiling = torch.autograd._profiler_enabled
        self._plain_zero_grad = type(optimizer).zero_grad is torch.optim.Optimizer.zero_grad
        self._sizes: list[int] = []  # len(params) per param group when last gathered
        self._anchors: list[tuple[torch.Tensor, torch.device]] = []  # a param per bucket
        self._params: list[torch.Tensor] = []
        # (params of one device and dtype, that device's found-inf flag, a 1.0 "scale")
        self._buckets: list[tuple[list[torch.Tensor], torch.Tensor, torch.Tensor]] = []
        # One found-inf flag per device, kept at 0, and on CPU a host view of it.
        self._flags: list[tuple[torch.Tensor, memoryview | None]] = []

    def autocast(self) -> Any:
        return self.precision.autocast() if self.precision else _NO_AUTOCAST

    def backward(self, loss: torch.Tensor) -> None:
        (self.scaler.scale(loss) if self.scaler is not None else loss).backward()

    def _refresh(self) -> None:
        """Re-gather the buckets if param groups were added or resized, or moved device."""
        groups = self.optimizer.param_groups
        sizes = [len(g["params"]) for g in groups]
        if sizes == self._sizes:
            for p, dev in self._anchors:
                if p.device != dev:
                    break
            else:
                return
        import torch

        params = [p for g in groups for p in g["params"]]
        by_kind: dict[Any, list[torch.Tensor]] = {}
        for p in params:
            by_kind.setdefault((p.device, p.dtype), []).append(p)
        flags: dict[Any, tuple[torch.Tensor, memoryview | None, torch.Tensor]] = {}
        for dev, _ in by_kind:
            if dev not in flags:
                flags[dev] = (*_flag(dev), torch.ones(1, device=dev))
        self._buckets = [(ps, flags[dev][0], flags[dev][2]) for (dev, _), ps in by_kind.items()]
        self._flags = [(found, host) for found, host, _ in flags.values()]
        self._anchors = [(ps[0], dev) for (dev, _), ps in by_kind.items()]
        self._params = params
        self._sizes = sizes

    def step(self) -> bool:
        """Apply the accumulated gradients unless one is inf/NaN; clear them either way."""
        opt = self.optimizer
        self._refresh()
        if self.scaler is not None:
            self.scaler.unscale_(opt)
            found = sum(v.item() for v in self.scaler._found_inf_per_device(opt).values())
            if self.clip is not None and not found:
                import torch

                torch.nn.utils.clip_grad_norm_(self._params, self.clip)
            self.scaler.step(opt)  # skips by itself when found
            self.scaler.update()
            ok = not found
        else:
            ok = self._finite_then_clip()
            if ok:
                opt.step()
        if not ok:
            self.skipped += 1
        if self.zero_grad:
            if self._plain_zero_grad and not self._profiling():
                for p in self._params:
                    p.grad = None
            else:
                opt.zero_grad(set_to_none=True)
        return ok

    def _finite_then_clip(self) -> bool:
        if self.clip is not None:
            import torch

            # The norm is computed for clipping anyway; a non-finite norm means a bad grad.
            norm = torch.nn.utils.clip_grad_norm_(self._params, self.clip)
            return bool(torch.isfinite(norm))
        for params, found, one in self._buckets:
            grads = [p.grad for p in params if p.grad is not None]
            if grads:
                self._check(grads, found, one)
        ok = True
        for found, host in self._flags:
            if (host[0] if host is not None else found.item()) != 0.0:
                found.zero_()  # the flags stay 0 between steps: no zeroing on the good path
                ok = False
        return ok

    def __call__(self, loss: torch.Tensor) -> bool:
        self.backward(loss)
        return self.step()

    def state_dict(self) -> dict[str, Any]:
        return {
            "scaler": self.scaler.state_dict() if self.scaler is not None else None,
            "skipped": self.skipped,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if self.scaler is not None and state.get("scaler"):
            self.scaler.load_state_dict(state["scaler"])
        self.skipped = int(state.get("skipped", 0))


def _flag(dev: torch.device) -> tuple[torch.Tensor, memoryview | None]:
    """A zero found-inf flag, and on CPU a view Python reads without a torch call.

    On CPU `.item()` costs as much as the fused check it would read; the kernel
    writes the flag's memory directly, so reading the bytes it shares with a
    bytearray gives the same answer. A CUDA flag needs `.item()`: the one host
    sync per step that GradScaler also makes.
    """
    import torch

    if dev.type == "cpu":
        memory = bytearray(4)
        return torch.frombuffer(memory, dtype=torch.float32), memoryview(memory).cast("f")
    return torch.zeros(1, device=dev), None
