"""torch.distributed readiness: a backend that exists here, and a coherent env:// rendezvous."""

from __future__ import annotations

from typing import Optional

from gpuwarden.doctor.checks.common import resolution
from gpuwarden.doctor.facts import Facts
from gpuwarden.doctor.findings import FAIL, INFO, PASS, SKIP, WARN, Finding

NAME = "distributed"
RENDEZVOUS = ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE")
RANK_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE")


def check_distributed(facts: Facts) -> list[Finding]:
    return _backend(facts) + _environment(facts)


def _backend(facts: Facts) -> list[Finding]:
    t = facts.torch
    name = "distributed.backend"
    if not t.installed:
        return [Finding(name, SKIP, "torch is not installed", t.skipped)]
    if t.distributed is False:
        return [
            Finding(
                name,
                WARN,
                "this torch is built without torch.distributed",
                f"torch {t.version}",
                "install an official torch wheel (they include torch.distributed)",
            )
        ]
    if facts.platform.startswith("win"):
        return [
            Finding(
                name,
                INFO,
                "Windows: NCCL is not available; use the gloo backend",
                f"platform {facts.platform}",
                "init_process_group(backend='gloo')",
            )
        ]
    if not t.cuda:
        return [
            Finding(
                name,
                INFO,
                "CPU build: NCCL is not available; use the gloo backend",
                f"torch {t.version}",
                "init_process_group(backend='gloo')",
            )
        ]
    if t.nccl is None:
        return [Finding(name, SKIP, "NCCL availability unknown (torch was not asked)")]
    if not t.nccl:
        return [
            Finding(
                name,
                WARN,
                "this CUDA build of torch has no NCCL: multi-GPU training falls back to gloo",
                f"torch {t.version}",
                "install an official Linux CUDA wheel (they bundle NCCL), or use backend='gloo'",
            )
        ]
    version = f" {t.nccl_version}" if t.nccl_version else ""
    return [Finding(name, PASS, f"NCCL{version} is available", f"torch {t.version}")]


def _int(env: dict[str, str], key: str, found: list[Finding]) -> Optional[int]:
    raw = env.get(key)
    if raw is None:
        return None
    try:
        return int(raw.strip())
    except ValueError:
        found.append(
            Finding(
                NAME,
                FAIL,
                f"{key}={raw!r} is not an integer",
                f"{key}={raw!r}",
                f"export {key}=<integer>  (torchrun sets it for you)",
            )
        )
        return None


def _environment(facts: Facts) -> list[Finding]:
    env = dict(facts.environ)
    present = [k for k in (*RENDEZVOUS, "LOCAL_RANK", "LOCAL_WORLD_SIZE") if k in env]
    if not present:
        return [Finding(NAME, SKIP, "no MASTER_ADDR/RANK/WORLD_SIZE set: not a distributed run")]
    saw = ", ".join(f"{k}={env[k]}" for k in present)
    found: list[Finding] = []
    nums = {k: _int(env, k, found) for k in (*RANK_VARS, "MASTER_PORT")}
    rendezvous_started = any(k in env for k in RENDEZVOUS)
    missing = [k for k in RENDEZVOUS if k not in env]
    if rendezvous_started and missing:
        found.append(
            Finding(
                NAME,
                FAIL,
                f"init_process_group('env://') needs {', '.join(RENDEZVOUS)}; "
                f"missing: {', '.join(missing)}",
                saw,
                "launch with `torchrun --nproc-per-node=N train.py` (it sets all of them), or "
                + " ".join(f"export {k}=..." for k in missing),
            )
        )
    port = nums["MASTER_PORT"]
    if port is not None and not 1 <= port <= 65535:
        found.append(
            Finding(
                NAME, FAIL, f"MASTER_PORT={port} is not a TCP port", saw, "export MASTER_PORT=29500"
            )
        )
    rank, world = nums["RANK"], nums["WORLD_SIZE"]
    local, local_world = nums["LOCAL_RANK"], nums["LOCAL_WORLD_SIZE"]
    if world is not None and world < 1:
        found.append(Finding(NAME, FAIL, f"WORLD_SIZE={world} must be >= 1", saw))
    if rank is not None and (rank < 0 or (world is not None and world >= 1 and rank >= world)):
        found.append(
            Finding(
                NAME,
                FAIL,
                f"RANK={rank} is outside 0..WORLD_SIZE-1",
                saw,
                "ranks run from 0 to WORLD_SIZE-1",
            )
        )
    if local is not None and local < 0:
        found.append(Finding(NAME, FAIL, f"LOCAL_RANK={local} is negative", saw))
    if local is not None and rank is not None and local > rank:
        found.append(
            Finding(
                NAME,
                WARN,
                f"LOCAL_RANK={local} is greater than RANK={rank}",
                saw,
                "LOCAL_RANK counts processes on this machine; it cannot exceed RANK",
            )
        )
    if local_world is not None and world is not None and local_world > world:
        found.append(
            Finding(NAME, FAIL, f"LOCAL_WORLD_SIZE={local_world} exceeds WORLD_SIZE={world}", saw)
        )
    if local is not None and local_world is not None and local >= local_world:
        found.append(
            Finding(NAME, FAIL, f"LOCAL_RANK={local} is outside 0..LOCAL_WORLD_SIZE-1", saw)
        )
    visible = _visible_count(facts)
    if local is not None and visible is not None and facts.snapshot.gpus and local >= visible >= 0:
        found.append(
            Finding(
                NAME,
                FAIL,
                f"LOCAL_RANK={local} but only {visible} GPU(s) are visible: "
                f"torch.cuda.set_device({local}) fails with 'invalid device ordinal'",
                saw,
                f"run at most {visible} process(es) per machine "
                f"(torchrun --nproc-per-node={visible}) or make more GPUs visible",
            )
        )
    if not found:
        found.append(Finding(NAME, PASS, "distributed environment variables are consistent", saw))
    return found


def _visible_count(facts: Facts) -> Optional[int]:
    try:
        return len(resolution(facts).devices)
    except Exception:
        return None
