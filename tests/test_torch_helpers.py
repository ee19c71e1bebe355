"""gpuwarden.torch helpers with real torch on CPU, in this process (one torch import)."""

from __future__ import annotations

import functools
import os
import random
import signal
from pathlib import Path

import pytest

from components import TORCH_MISSING, require, torch_found

require(torch_found(), TORCH_MISSING, module=True)
import torch  # noqa: E402

from gpuwarden.base.errors import UserError  # noqa: E402
from gpuwarden.torch import (  # noqa: E402
    AmpStep,
    Checkpointer,
    accumulate,
    device,
    hide_gpus,
    init_distributed,
    precision,
    use_gpus,
    visibility,
    wrap,
)


def test_device_falls_back_to_cpu_and_honours_request(monkeypatch: pytest.MonkeyPatch) -> None:
    assert device() == torch.device("cpu")  # CPU build: no CUDA, no MPS
    monkeypatch.setenv("GPUWARDEN_DEVICE", "cuda")
    with pytest.raises(UserError, match="no CUDA GPU is visible"):
        device()
    monkeypatch.setenv("GPUWARDEN_DEVICE", "cpu")
    assert device().type == "cpu"
    assert not torch.cuda.is_initialized()


def test_use_gpus_sets_order_and_value(monkeypatch: pytest.MonkeyPatch) -> None:
    assert use_gpus([2, "3"]) == "2,3"
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "2,3"
    assert os.environ["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
    hide_gpus()
    assert os.environ["CUDA_VISIBLE_DEVICES"] == ""
    with pytest.raises(UserError, match="neither a GPU index"):
        use_gpus(["cuda:0"])
    with pytest.raises(UserError, match="twice"):
        use_gpus([1, 1])


def test_use_gpus_forgets_counts_torch_cached(monkeypatch: pytest.MonkeyPatch) -> None:
    # torch 2.1-2.3 cached device_count() in an lru_cache; stand one in and check that
    # use_gpus() makes the count follow the new CUDA_VISIBLE_DEVICES.
    @functools.lru_cache(maxsize=1)
    def cached_count() -> int:
        value = os.environ.get("CUDA_VISIBLE_DEVICES", "0,1,2,3")
        return len([v for v in value.split(",") if v])

    monkeypatch.setattr(torch.cuda, "_device_count_nvml", cached_count, raising=False)
    monkeypatch.setattr(torch.cuda, "_cached_device_count", 4, raising=False)
    assert cached_count() == 4
    use_gpus([5])
    assert cached_count() == 1
    assert torch.cuda._cached_device_count is None


def test_use_gpus_refuses_once_cuda_started(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    with pytest.raises(UserError, match=r"already initialised CUDA.*reads it only once"):
        use_gpus([1])
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "0"
    assert use_gpus([0]) == "0"  # the value in force is not a change
    assert visibility.driver_started() is False  # no libcuda loaded here


def test_init_distributed_single_process_has_no_group() -> None:
    import torch.distributed as dist

    with init_distributed() as info:
        assert (info.rank, info.world_size, info.backend, info.environment) == (
            0,
            1,
            "gloo",
            "single",
        )
        assert info.device == torch.device("cpu") and info.is_main
        assert not dist.is_initialized()
        model = wrap(torch.nn.Linear(2, 1), info)
        assert isinstance(model, torch.nn.Linear)


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))


def _grads(model: torch.nn.Module) -> list[torch.Tensor]:
    return [p.grad.clone() for p in model.parameters()]


def _data(n: int = 32) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    return torch.randn(n, 8, generator=g), torch.randn(n, 1, generator=g)


def _accumulated(batches: object, every: int) -> tuple[list[list[torch.Tensor]], list[int]]:
    model = _model()
    grads, steps = [], []
    for i, ((x, y), micro) in enumerate(accumulate(batches, every=every, model=model)):
        with micro:
            micro.scale(torch.nn.functional.mse_loss(model(x), y)).backward()
        if micro.last:
            grads.append(_grads(model))
            steps.append(i)
            model.zero_grad()
    return grads, steps


def _reference(x: torch.Tensor, y: torch.Tensor) -> list[torch.Tensor]:
    model = _model()
    torch.nn.functional.mse_loss(model(x), y).backward()
    return _grads(model)


def _close(a: list[torch.Tensor], b: list[torch.Tensor]) -> None:
    for ga, gb in zip(a, b):
        torch.testing.assert_close(ga, gb, rtol=1e-5, atol=1e-6)


def test_accumulating_4_micro_batches_of_8_equals_one_batch_of_32() -> None:
    x, y = _data()
    micro = [(x[i : i + 8], y[i : i + 8]) for i in range(0, 32, 8)]
    grads, steps = _accumulated(micro, every=4)
    assert steps == [3]
    _close(grads[0], _reference(x, y))
    # the naive sum (no division) would be 4x too large: the test can fail
    assert not torch.allclose(grads[0][0] * 4, _reference(x, y)[0])


@pytest.mark.parametrize("sized", [True, False])
def test_partial_last_group_is_scaled_by_its_own_size(sized: bool) -> None:
    x, y = _data(48)  # 6 micro-batches of 8 with every=4: groups of 4 and 2
    micro = [(x[i : i + 8], y[i : i + 8]) for i in range(0, 48, 8)]
    grads, steps = _accumulated(micro if sized else iter(micro), every=4)
    assert steps == [3, 5]
    _close(grads[0], _reference(x[:32], y[:32]))
    _close(grads[1], _reference(x[32:], y[32:]))


def test_accumulate_rejects_zero() -> None:
    with pytest.raises(UserError):
        list(accumulate([1], every=0))


def _step_with(values: float, scaler: bool, clip: float | None) -> tuple[bool, AmpStep]:
    model = torch.nn.Linear(3, 1)
    before = [p.detach().clone() for p in model.parameters()]
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    prec = precision("fp16" if scaler else "fp32", torch.device("cpu"))
    amp = AmpStep(opt, prec, clip=clip)
    assert (amp.scaler is not None) == scaler
    loss = (model(torch.ones(2, 3)) * values).sum()
    ok = amp(loss)
    changed = any(not torch.equal(b, p) for b, p in zip(before, model.parameters()))
    assert changed == ok
    assert all(p.grad is None for p in model.parameters())
    return ok, amp


@pytest.mark.parametrize("scaler", [False, True])
@pytest.mark.parametrize("clip", [None, 1.0])
def test_amp_step_skips_non_finite_gradients(scaler: bool, clip: float | None) -> None:
    ok, amp = _step_with(1.0, scaler, clip)
    assert ok and amp.skipped == 0
    ok, amp = _step_with(float("nan"), scaler, clip)
    assert not ok and amp.skipped == 1
    ok, amp = _step_with(float("inf"), scaler, clip)
    assert not ok and amp.skipped == 1


def _poison(model: torch.nn.Module, which: int, value: float) -> None:
    """Give every parameter a finite gradient except parameter `which`."""
    for i, p in enumerate(model.parameters()):
        p.grad = torch.full_like(p, value if i == which else 0.5)


@pytest.mark.parametrize("which", [0, 1, 3])
def test_amp_step_finds_one_bad_element_among_many_then_steps_again(which: int) -> None:
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Linear(3, 2)).double()
    model[1].float()  # two dtypes: two fused checks
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    amp = AmpStep(opt, precision("fp32", torch.device("cpu")))
    before = [p.detach().clone() for p in model.parameters()]
    _poison(model, which, 0.5)
    next(iter(model.parameters())).grad = None  # a parameter without a gradient is fine
    assert amp.step()
    after = [p.detach().clone() for p in model.parameters()]
    assert any(not torch.equal(b, a) for b, a in zip(before, after))
    for bad in (float("nan"), float("inf"), float("-inf")):
        _poison(model, which, 0.5)
        list(model.parameters())[which].grad.view(-1)[-1] = bad  # one element of one tensor
        assert not amp.step()
        assert all(torch.equal(a, p) for a, p in zip(after, model.parameters()))
    assert amp.skipped == 3
    _poison(model, which, 0.5)
    assert amp.step()  # the flag was reset: a good step after bad ones is applied
    assert all(p.grad is None for p in model.parameters())


def test_amp_step_checks_a_param_group_added_later() -> None:
    first, second = torch.nn.Linear(2, 2), torch.nn.Linear(2, 2)
    opt = torch.optim.SGD(first.parameters(), lr=0.1)
    amp = AmpStep(opt, precision("fp32", torch.device("cpu")))
    _poison(first, -1, 0.5)
    assert amp.step()
    opt.add_param_group({"params": list(second.parameters())})
    _poison(first, -1, 0.5)
    _poison(second, 1, float("nan"))
    assert not amp.step()
    assert second.bias.grad is None  # cleared with the rest


def test_amp_step_clears_through_an_overridden_zero_grad_or_under_a_profiler() -> None:
    calls = []

    class Counting(torch.optim.SGD):
        def zero_grad(self, set_to_none: bool = True) -> None:
            calls.append(set_to_none)
            super().zero_grad(set_to_none)

    model = torch.nn.Linear(2, 1)
    amp = AmpStep(Counting(model.parameters(), lr=0.1), precision("fp32", torch.device("cpu")))
    _poison(model, -1, 0.5)
    assert amp.step() and calls == [True]
    assert model.weight.grad is None

    plain = torch.optim.SGD(model.parameters(), lr=0.1)
    amp = AmpStep(plain, precision("fp32", torch.device("cpu")))
    _poison(model, -1, 0.5)
    with torch.profiler.profile() as prof:
        amp.step()
    assert model.weight.grad is None
    assert any("zero_grad" in e.name for e in prof.events())  # the profiler still sees it


def test_amp_step_clips_after_unscaling() -> None:
    model = torch.nn.Linear(3, 1, bias=False)
    torch.nn.init.zeros_(model.weight)
    opt = torch.optim.SGD(model.parameters(), lr=1.0)
    amp = AmpStep(opt, precision("fp16", torch.device("cpu")), clip=0.5, zero_grad=False)
    amp((model(torch.full((1, 3), 100.0))).sum())
    # unscaled grad norm is 173; clipped to 0.5 (a scaled grad would have clipped at 0.5/65536)
    assert torch.linalg.vector_norm(model.weight.grad).item() == pytest.approx(0.5, rel=1e-4)
    assert torch.linalg.vector_norm(model.weight).item() == pytest.approx(0.5, rel=1e-4)


def test_precision_auto_on_cpu_is_fp32_and_bf16_autocasts() -> None:
    assert precision().name == "fp32"
    bf16 = precision("bf16", torch.device("cpu"))
    with bf16.autocast():
        out = torch.nn.Linear(4, 4)(torch.randn(2, 4))
    assert out.dtype == torch.bfloat16


def _trained(ckpt: Checkpointer | None, steps: int, start: int = 0) -> torch.nn.Module:
    model, opt, sched = ckpt.objects["model"], ckpt.objects["optimizer"], ckpt.objects["scheduler"]
    for step in range(start, steps):
        x = torch.randn(4, 8)
        loss = model(x).pow(2).mean() + random.random()
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
        ckpt.step_done(step + 1)
    return model


def _checkpointer(directory: Path, **kw: object) -> Checkpointer:
    model = _model()
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=3, gamma=0.5)
    return Checkpointer(directory, model=model, optimizer=opt, scheduler=sched, **kw)


def test_checkpoint_resume_matches_uninterrupted_and_keeps_last_k(tmp_path: Path) -> None:
    torch.manual_seed(5)
    random.seed(5)
    full = _trained(_checkpointer(tmp_path / "a", every=100), 10)

    torch.manual_seed(5)
    random.seed(5)
    first = _checkpointer(tmp_path / "b", keep=2, every=2)
    _trained(first, 7)  # saves 2, 4, 6; keeps 4 and 6
    assert [p.name for p in first.checkpoints()] == ["step-00000004.pt", "step-00000006.pt"]
    torch.manual_seed(999)  # a fresh process would start from other RNG states
    random.seed(999)
    second = _checkpointer(tmp_path / "b", keep=2, every=2)
    start = second.resume()
    assert start == 6
    resumed = _trained(second, 10, start)
    for a, b in zip(full.state_dict().values(), resumed.state_dict().values()):
        assert torch.equal(a, b)
    assert not list((tmp_path / "b").glob(".step-*"))  # no temporary files left behind


@pytest.mark.parametrize("damage", ["truncate", "flip"])
def test_resume_skips_a_damaged_newest_checkpoint(tmp_path: Path, damage: str) -> None:
    ckpt = _checkpointer(tmp_path, every=1)
    ckpt.save(1)
    newest = ckpt.save(2)
    data = bytearray(newest.read_bytes())
    if damage == "truncate":
        newest.write_bytes(data[: len(data) // 2])
    else:
        data[len(data) // 2] ^= 0xFF  # inside the payload: torch.load alone would accept it
        newest.write_bytes(bytes(data))
    with pytest.warns(RuntimeWarning, match="skipping checkpoint .*step-00000002"):
        assert _checkpointer(tmp_path).resume() == 1


def test_resume_without_checkpoints_starts_at_zero(tmp_path: Path) -> None:
    assert _checkpointer(tmp_path / "none").resume() == 0


def test_sigterm_saves_at_the_step_boundary_then_exits(tmp_path: Path) -> None:
    ckpt = _checkpointer(tmp_path)
    previous = signal.getsignal(signal.SIGTERM)
    try:
        ckpt.install_signal_handlers()
        ckpt.step_done(1)
        assert ckpt.checkpoints() == []
        os.kill(os.getpid(), signal.SIGTERM)
        with pytest.raises(SystemExit) as exited:
            ckpt.step_done(2)
        assert exited.value.code == 128 + signal.SIGTERM
        assert [p.name for p in ckpt.checkpoints()] == ["step-00000002.pt"]
    finally:
        signal.signal(signal.SIGTERM, previous)
