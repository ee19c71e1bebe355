"""Checkpoints that survive a kill at any instant, and preemption that saves first.

A checkpoint is one file, `step-<N>.pt`, written to a temporary name, fsynced,
renamed into place and the directory fsynced, so a reader sees either the whole
old set or the whole new file. A SHA-256 trailer catches what the zip format
does not (a flipped byte inside a tensor loads silently otherwise); `resume()`
walks from the newest file to older ones, warning about any it must skip.

Files are loaded with `weights_only=True`: RNG states are stored as plain lists
and tensors, so loading a checkpoint from a shared directory cannot run code.

SIGTERM and SIGUSR1 (what Slurm sends before preemption or at `--signal`) do not
save from inside the handler, which could catch the optimizer half-way through
an update; they set a flag that `step_done()` acts on at the next step boundary:
save, then exit with 128 + signal number.
"""

from __future__ import annotations

import io
import os
import random
import sys
import warnings
from pathlib import Path
from typing import Any

from gpuwarden.base.errors import UserError

_MAGIC = b"GPUWARDEN-CKPT1\n"
_TRAILER = len(_MAGIC) + 32
_NAME = r"step-(\d+)\.pt"


class Checkpointer:
    """Save and resume training state; keep the newest `keep` checkpoints."""

    def __init__(
        self,
        directory: str | os.PathLike[str],
        keep: int = 3,
        *,
        every: int | None = None,
        signals: tuple[int, ...] | None = None,
        **objects: Any,
    ) -> None:
        if keep < 1:
            raise UserError(f"Checkpointer: keep={keep}; it must be at least 1")
        self.directory = Path(directory)
        self.keep = keep
        self.every = every
        self.objects: dict[str, Any] = {k: v for k, v in objects.items() if v is not None}
        self.preempted: int | None = None
        self._signals = signals
        self._installed = False

    # -- what is saved ---------------------------------------------------------------
    def track(self, **objects: Any) -> Checkpointer:
        """Add objects with state_dict()/load_state_dict() (model, optimizer, scheduler, ...)."""
        self.objects.update({k: v for k, v in objects.items() if v is not None})
        return self

    def state(self, step: int) -> dict[str, Any]:
        from gpuwarden.torch.ddp import unwrap

        return {
            "step": step,
            "objects": {k: unwrap(v).state_dict() for k, v in self.objects.items()},
            "rng": rng_state(),
        }

    # -- writing ---------------------------------------------------------------------
    def save(self, step: int) -> Path | None:
        """Write step `step` atomically (rank 0 only under DDP); prune to `keep` files."""
        if not _is_main():
            return None
        import torch

        self.directory.mkdir(parents=True, exist_ok=True)
        final = self.directory / f"step-{step:08d}.pt"
        import tempfile

        fd, tmp = tempfile.mkstemp(prefix=".step-", suffix=".tmp", dir=self.directory)
        try:
            with os.fdopen(fd, "wb") as f:
                hashing = _HashingWriter(f)
                torch.save(self.state(step), hashing)
                f.write(_MAGIC + hashing.digest())
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, final)
        except BaseException:
            with _suppress():
                os.unlink(tmp)
            raise
        _fsync_dir(self.directory)
        self._prune()
        return final

    def _prune(self) -> None:
        for old in self.checkpoints()[: -self.keep]:
            with _suppress():
                old.unlink()

    def checkpoints(self) -> list[Path]:
        """Checkpoint files, oldest first."""
        import re

        if not self.directory.is_dir():
            return []
        found = []
        for path in self.directory.iterdir():
            m = re.fullmatch(_NAME, path.name)
            if m:
                found.append((int(m.group(1)), path))
        return [p for _, p in sorted(found)]

    # -- reading ---------------------------------------------------------------------
    def resume(self) -> int:
        """Restore the newest valid checkpoint; returns its step (0 when there is none)."""
        for path in reversed(self.checkpoints()):
            try:
                state = load(path)
            except (OSError, RuntimeError, ValueError, EOFError) as err:
                warnings.warn(f"skipping checkpoint {path}: {err}", RuntimeWarning, stacklevel=2)
                continue
            self.restore(state)
            return int(state["step"])
        return 0

    def restore(self, state: dict[str, Any]) -> None:
        from gpuwarden.torch.ddp import unwrap

        missing = set(self.objects) - set(state["objects"])
        if missing:
            raise UserError(f"checkpoint has no state for {', '.join(sorted(missing))}")
        for name, obj in self.objects.items():
            unwrap(obj).load_state_dict(state["objects"][name])
        set_rng_state(state["rng"])

    # -- preemption ------------------------------------------------------------------
    def install_signal_handlers(self) -> Checkpointer:
        """Turn SIGTERM/SIGUSR1 into "save at the end of this step, then exit"."""
        import signal

        signals = self._signals
        if signals is None:  # what Slurm sends before preemption, and at --signal
            signals = (signal.SIGTERM, getattr(signal, "SIGUSR1", signal.SIGTERM))
        for sig in signals:
            signal.signal(sig, self._on_signal)
        self._installed = True
        return self

    def _on_signal(self, signum: int, frame: Any) -> None:
        self.preempted = signum

    def step_done(self, step: int) -> None:
        """Call after each optimizer step: saves every `every` steps, and on preemption."""
        preempted = self.preempted
        if self._installed and _group_running():
            preempted = _agree(preempted)
        if preempted or (self.every and step % self.every == 0):
            self.save(step)
        if preempted:
            print(
                f"gpuwarden: saved step {step} after signal {preempted}; exiting",
                file=sys.stderr,
                flush=True,
            )
            raise SystemExit(128 + preempted)


def load(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Read and verify one checkpoint file; ValueError if it is truncated or corrupt."""
    import torch

    data = Path(path).read_bytes()
    if len(data) < _TRAILER or data[-_TRAILER:-32] != _MAGIC:
        raise ValueError("truncated or not a gpuwarden checkpoint")
    body = memoryview(data)[:-_TRAILER]
    import hashlib

    if hashlib.sha256(body).digest() != data[-32:]:
        raise ValueError("checksum mismatch (corrupt file)")
    return torch.load(io.BytesIO(body), map_location="cpu", weights_only=True)


class _HashingWriter(io.RawIOBase):
    """A write-only file for torch.save that hashes what passes through."""

    def __init__(self, f: Any) -> None:
        self._f = f
        import hashlib

        self._h = hashlib.sha256()

    def writable(self) -> bool:
        return True

    def write(self, b: Any) -> int:
        self._h.update(b)
        return self._f.write(b)

    def flush(self) -> None:
        self._f.flush()

    def digest(self) -> bytes:
        return self._h.digest()


def rng_state() -> dict[str, Any]:
    """Every RNG a training loop draws from, as weights_only-loadable values."""
    import torch

    state: dict[str, Any] = {"python": random.getstate(), "torch": torch.get_rng_state()}
    np = sys.modules.get("numpy")
    if np is not None:
        kind, keys, pos, has_gauss, gauss = np.random.get_state()
        state["numpy"] = [kind, torch.from_numpy(keys.astype("int64")), pos, has_gauss, gauss]
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    import torch

    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    torch.set_rng_state(state["torch"])
    np = sys.modules.get("numpy")
    if np is not None and "numpy" in state:
        kind, keys, pos, has_gauss, gauss = state["numpy"]
        np.random.set_state((kind, keys.numpy().astype("uint32"), pos, has_gauss, gauss))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def _is_main() -> bool:
    import torch.distributed as dist

    return not (dist.is_available() and dist.is_initialized()) or dist.get_rank() == 0


def _group_running() -> bool:
    import torch.distributed as dist

    return dist.is_available() and dist.is_initialized()


def _agree(flag: int | None) -> int | None:
    """Under DDP, the highest signal any rank saw, so all ranks save and stop together."""
    import torch
    import torch.distributed as dist

    backend = dist.get_backend()
    dev = torch.device("cuda", torch.cuda.current_device()) if backend == "nccl" else None
    t = torch.tensor([flag or 0], device=dev)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return int(t.item()) or None


def _fsync_dir(directory: Path) -> None:
    if os.name != "posix":
        return  # Windows cannot open a directory for fsync; rename there is already durable
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class _suppress:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: Any) -> bool:
        return exc[0] is not None and issubclass(exc[0], OSError)
