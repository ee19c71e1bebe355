"""What gpuwarden.torch costs a training loop and an import, measured against plain PyTorch.

1. A 300-step CPU training loop of a small MLP, written twice: plain PyTorch (the
   seeds' loop: loss / K, backward, step every K, zero_grad) and with every helper
   (init_distributed, wrap, precision, AmpStep with its inf/NaN check, accumulate,
   Checkpointer.step_done with signal handlers). Repetitions alternate between the
   two so machine noise hits both alike; the figure is the ratio of median times
   (target <= 1.02).
2. `import gpuwarden.torch` (and touching every export) after `import torch`, in
   fresh interpreters (target <= 5 ms).

Run: .venv/bin/python bench/torch_overhead.py [--reps 7] [--steps 300]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time

import torch
from torch import nn

ACCUMULATE = 2
BATCH = 32


def make() -> tuple[nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 128), nn.ReLU())
    model.append(nn.Linear(128, 1))
    return model, torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)


def data(steps: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(1)
    n = steps * ACCUMULATE
    return [(torch.randn(BATCH, 64, generator=g), torch.randn(BATCH, 1, generator=g))] * n


def plain(batches: list) -> float:
    model, opt = make()
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model.to(dev)
    start = time.perf_counter()
    for i, (x, y) in enumerate(batches):
        x, y = x.to(dev), y.to(dev)
        loss = nn.functional.mse_loss(model(x), y) / ACCUMULATE
        loss.backward()
        if (i + 1) % ACCUMULATE == 0:
            opt.step()
            opt.zero_grad(set_to_none=True)
    if dev.type == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - start


def helped(batches: list, ckpt_dir: str) -> float:
    from gpuwarden.torch import AmpStep, Checkpointer, accumulate, init_distributed, precision, wrap

    info = init_distributed()
    model, opt = make()
    model = wrap(model, info)
    prec = precision("fp32", info.device)  # same arithmetic as the plain loop
    amp = AmpStep(opt, prec)
    ckpt = Checkpointer(ckpt_dir, model=model, optimizer=opt).install_signal_handlers()
    start = time.perf_counter()
    step = 0
    for (x, y), micro in accumulate(batches, every=ACCUMULATE, model=model):
        x, y = x.to(info.device), y.to(info.device)
        with micro:
            with prec.autocast():
                loss = nn.functional.mse_loss(model(x), y)
            amp.backward(micro.scale(loss))
        if micro.last:
            amp.step()
            step += 1
            ckpt.step_done(step)
    if info.device.type == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - start


def import_cost(reps: int) -> tuple[float, float]:
    code = (
        "import time; t0 = time.perf_counter(); import torch; t1 = time.perf_counter(); "
        "import gpuwarden.torch as g; [getattr(g, n) for n in g.__all__]; "
        "t2 = time.perf_counter(); print(t1 - t0, t2 - t1)"
    )
    torch_s, ours_s = [], []
    for _ in range(reps):
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
        a, b = map(float, out.stdout.split())
        torch_s.append(a)
        ours_s.append(b)
    return statistics.median(torch_s), statistics.median(ours_s)


def main() -> int:
    p = argparse.ArgumentParser(description="gpuwarden.torch overhead vs plain PyTorch")
    p.add_argument("--reps", type=int, default=7)
    p.add_argument("--steps", type=int, default=300)
    args = p.parse_args()
    batches = data(args.steps)
    plain(batches), helped(batches, tempfile.mkdtemp())  # warm-up: allocator, caches
    plain_s, helped_s = [], []
    with tempfile.TemporaryDirectory() as ckpt_dir:
        for rep in range(args.reps):
            order = (plain, helped) if rep % 2 == 0 else (helped, plain)
            for fn in order:
                t = fn(batches) if fn is plain else fn(batches, ckpt_dir)
                (plain_s if fn is plain else helped_s).append(t)
    p_med, h_med = statistics.median(plain_s), statistics.median(helped_s)
    print(f"training loop: {args.steps} steps x {ACCUMULATE} micro-batches of {BATCH}, MLP")
    print(f"  threads={torch.get_num_threads()} reps={args.reps} (interleaved)")
    print(
        f"  plain PyTorch     median {p_med * 1000:8.1f} ms "
        f"({p_med / args.steps * 1e6:.0f} us/step)"
    )
    print(
        f"  gpuwarden helpers median {h_med * 1000:8.1f} ms "
        f"({h_med / args.steps * 1e6:.0f} us/step)"
    )
    print(f"  ratio helpers/plain: {h_med / p_med:.3f}  (target <= 1.02)")
    t_torch, t_ours = import_cost(max(5, args.reps))
    print("import:")
    print(f"  import torch                        {t_torch * 1000:8.1f} ms")
    print(f"  + import gpuwarden.torch (all names) {t_ours * 1000:7.1f} ms  (target <= 5 ms)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
