"""Train a small regression model on synthetic data with every gpuwarden.torch helper.

Runs unchanged as any of

    python examples/train.py
    gpuwarden run -g 1 -- python examples/train.py       # one leased GPU (CPU if none)
    gpuwarden run --ddp --nproc 2 -- examples/train.py   # two processes, gloo
    srun python examples/train.py                        # Slurm, one task per GPU

Kill it and start it again with the same --checkpoint-dir: it resumes where the
last checkpoint left off and ends with the same weights as an uninterrupted run.
"""

from __future__ import annotations

import argparse
import time

import torch
from torch import nn

from gpuwarden.torch import (
    AmpStep,
    Checkpointer,
    accumulate,
    init_distributed,
    precision,
    unwrap,
    wrap,
)


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=150, help="optimizer steps")
    p.add_argument("--micro-batch", type=int, default=16, help="samples per micro-batch")
    p.add_argument("--accumulate", type=int, default=4, help="micro-batches per step")
    p.add_argument("--precision", default="auto", help="auto, fp32, bf16 or fp16")
    p.add_argument("--checkpoint-dir", default=None, help="save/resume here")
    p.add_argument("--save-every", type=int, default=25, help="steps between checkpoints")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: default)")
    p.add_argument("--sleep", type=float, default=0.0, help="seconds per step (for demos)")
    p.add_argument("--out", default=None, help="write the final weights here (rank 0)")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    info = init_distributed()  # single process: no process group, just the device
    torch.manual_seed(args.seed)  # same initial weights and data stream on every rank
    model = wrap(nn.Sequential(nn.Linear(32, 64), nn.Tanh(), nn.Linear(64, 1)), info)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=50, gamma=0.5)
    prec = precision(args.precision, info.device)
    amp = AmpStep(optimizer, prec, clip=1.0)
    ckpt = None
    step = 0
    if args.checkpoint_dir:
        ckpt = Checkpointer(
            args.checkpoint_dir,
            keep=3,
            every=args.save_every,
            model=model,
            optimizer=optimizer,
            scheduler=scheduler,
            amp=amp,
        ).install_signal_handlers()
        step = ckpt.resume()
    if info.is_main:
        print(
            f"device={info.device} backend={info.backend} world={info.world_size} "
            f"env={info.environment} precision={prec.name} start_step={step}",
            flush=True,
        )
    true_w = torch.linspace(-1, 1, 32)
    started = time.perf_counter()
    loss_value = float("nan")
    while step < args.steps:
        # Every rank draws the whole global batch and keeps its own shard: the data
        # stream depends only on the (checkpointed) RNG, not on the world size.
        size = args.micro_batch * info.world_size
        group = []
        for _ in range(args.accumulate):
            x = torch.randn(size, 32)
            y = (x @ true_w).unsqueeze(1) + 0.1 * torch.randn(size, 1)
            shard = slice(info.rank * args.micro_batch, (info.rank + 1) * args.micro_batch)
            group.append((x[shard], y[shard]))
        for (x, y), micro in accumulate(group, every=args.accumulate, model=model):
            x, y = x.to(info.device, non_blocking=True), y.to(info.device, non_blocking=True)
            with micro:
                with prec.autocast():
                    loss = nn.functional.mse_loss(model(x).float(), y)
                amp.backward(micro.scale(loss))
            if micro.last:
                amp.step()
                scheduler.step()
        step += 1
        loss_value = loss.item()
        if args.sleep:
            time.sleep(args.sleep)
        if ckpt is not None:
            ckpt.step_done(step)
        if info.is_main and step % 50 == 0:
            print(f"step {step} loss {loss_value:.4f}", flush=True)
    if info.is_main:
        took = time.perf_counter() - started
        print(f"done: {step} steps, loss {loss_value:.4f}, {took:.2f}s", flush=True)
        if args.out:
            torch.save({k: v.cpu() for k, v in unwrap(model).state_dict().items()}, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
