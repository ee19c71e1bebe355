"""How this process was launched: torchrun, Slurm, MPI, or nothing at all.

Each launcher announces rank, world size and the rendezvous host through its own
environment variables. One small class per launcher reads them; `detect()`
asks each in a fixed order and returns a frozen `Launch`. Everything here is pure
(a mapping in, a record out) and imports no torch, so it is tested exhaustively
from dictionaries and `device()` can use it without paying for torch.distributed.

Order matters: torchrun inside a Slurm allocation sets both families of
variables, and torchrun's are the truth for its worker processes.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import ClassVar

from gpuwarden.base.errors import UserError
from gpuwarden.base.records import record
from gpuwarden.base.units import is_digits

DEFAULT_PORT = 29500


@record
class Launch:
    """What the launcher told this process about its place in the job."""

    environment: str
    rank: int
    local_rank: int
    world_size: int
    local_world_size: int
    master_addr: str | None
    master_port: int

    @property
    def distributed(self) -> bool:
        return self.world_size > 1 or self.environment != "single"


def _int(environ: Mapping[str, str], name: str, default: int | None = None) -> int:
    raw = environ.get(name)
    if raw is None or raw.strip() == "":
        if default is None:
            raise UserError(f"{name} is not set but the launcher needs it")
        return default
    try:
        return int(raw.strip().split("(")[0])  # Slurm writes counts like "2(x4)"
    except ValueError:
        raise UserError(f"{name}={raw!r} is not a whole number") from None


def _checked(launch: Launch) -> Launch:
    """Refuse variables that cannot describe a real job, before they hang a rendezvous."""
    env = launch.environment
    if launch.world_size < 1:
        raise UserError(f"{env}: world size is {launch.world_size}; it must be at least 1")
    if not 0 <= launch.rank < launch.world_size:
        raise UserError(
            f"{env}: rank {launch.rank} is outside world size {launch.world_size} "
            f"(ranks run 0..{launch.world_size - 1}); the launcher's variables disagree"
        )
    if not 0 <= launch.local_rank < launch.local_world_size:
        raise UserError(
            f"{env}: local rank {launch.local_rank} is outside the "
            f"{launch.local_world_size} processes on this node"
        )
    if launch.local_world_size > launch.world_size:
        raise UserError(
            f"{env}: {launch.local_world_size} processes on this node but only "
            f"{launch.world_size} in the whole job"
        )
    if not 0 < launch.master_port < 65536:
        raise UserError(f"{env}: master port {launch.master_port} is not a TCP port")
    if launch.master_addr is None:
        if launch.local_world_size < launch.world_size:
            raise UserError(
                f"{env}: the job spans several nodes ({launch.world_size} processes, "
                f"{launch.local_world_size} here) but MASTER_ADDR is not set; "
                "export MASTER_ADDR=<host of rank 0> on every node"
            )
        launch = Launch(**{**launch.__dict__, "master_addr": "127.0.0.1"})
    return launch


class Environment:
    """One launcher: `detect` says whether it started us, `read` says what it told us."""

    name: ClassVar[str] = ""

    @staticmethod
    def detect(environ: Mapping[str, str]) -> bool:
        raise NotImplementedError

    @classmethod
    def read(cls, environ: Mapping[str, str]) -> Launch:
        raise NotImplementedError


class TorchElastic(Environment):
    """torchrun / torch.distributed.run (and `gpuwarden run --ddp`), or hand-set env:// vars."""

    name = "torchelastic"

    @staticmethod
    def detect(environ: Mapping[str, str]) -> bool:
        return "RANK" in environ and "WORLD_SIZE" in environ

    @classmethod
    def read(cls, environ: Mapping[str, str]) -> Launch:
        world = _int(environ, "WORLD_SIZE")
        return _checked(
            Launch(
                environment=cls.name,
                rank=_int(environ, "RANK"),
                local_rank=_int(environ, "LOCAL_RANK", 0),
                world_size=world,
                local_world_size=_int(environ, "LOCAL_WORLD_SIZE", world),
                master_addr=environ.get("MASTER_ADDR") or None,
                master_port=_int(environ, "MASTER_PORT", DEFAULT_PORT),
            )
        )


class Slurm(Environment):
    """`srun python train.py`: one task per process; rank 0's host is the nodelist's first."""

    name = "slurm"

    @staticmethod
    def detect(environ: Mapping[str, str]) -> bool:
        # The batch script itself also sees SLURM_NTASKS; only srun sets a step's
        # SLURM_STEP_ID, so a plain `python train.py` inside sbatch stays single.
        return "SLURM_PROCID" in environ and "SLURM_STEP_ID" in environ

    @classmethod
    def read(cls, environ: Mapping[str, str]) -> Launch:
        world = _int(environ, "SLURM_STEP_NUM_TASKS", _int(environ, "SLURM_NTASKS", 1))
        nodelist = (
            environ.get("SLURM_STEP_NODELIST")
            or environ.get("SLURM_JOB_NODELIST")
            or environ.get("SLURM_NODELIST")
        )
        addr = environ.get("MASTER_ADDR") or (first_host(nodelist) if nodelist else None)
        job = environ.get("SLURM_JOB_ID", "")
        # Every task must agree on a port without talking; derive it from the job id
        # so two jobs sharing a node do not collide.
        port = 15000 + int(job) % 20000 if is_digits(job) else DEFAULT_PORT
        return _checked(
            Launch(
                environment=cls.name,
                rank=_int(environ, "SLURM_PROCID"),
                local_rank=_int(environ, "SLURM_LOCALID", 0),
                world_size=world,
                local_world_size=tasks_on_node(
                    environ.get("SLURM_STEP_TASKS_PER_NODE")
                    or environ.get("SLURM_TASKS_PER_NODE")
                    or str(world),
                    _int(environ, "SLURM_NODEID", 0),
                ),
                master_addr=addr,
                master_port=_int(environ, "MASTER_PORT", port),
            )
        )


class MPI(Environment):
    """`mpirun` from Open MPI (OMPI_COMM_WORLD_*) or MPICH/Intel MPI's hydra (PMI_*)."""

    name = "mpi"

    @staticmethod
    def detect(environ: Mapping[str, str]) -> bool:
        return "OMPI_COMM_WORLD_RANK" in environ or "PMI_RANK" in environ

    @classmethod
    def read(cls, environ: Mapping[str, str]) -> Launch:
        if "OMPI_COMM_WORLD_RANK" in environ:
            rank = _int(environ, "OMPI_COMM_WORLD_RANK")
            world = _int(environ, "OMPI_COMM_WORLD_SIZE")
            local = _int(environ, "OMPI_COMM_WORLD_LOCAL_RANK", 0)
            local_world = _int(environ, "OMPI_COMM_WORLD_LOCAL_SIZE", world)
        else:
            rank = _int(environ, "PMI_RANK")
            world = _int(environ, "PMI_SIZE")
            local = _int(environ, "MPI_LOCALRANKID", 0)
            local_world = _int(environ, "MPI_LOCALNRANKS", world)
        return _checked(
            Launch(
                environment=cls.name,
                rank=rank,
                local_rank=local,
                world_size=world,
                local_world_size=local_world,
                master_addr=environ.get("MASTER_ADDR") or None,
                master_port=_int(environ, "MASTER_PORT", DEFAULT_PORT),
            )
        )


class SingleProcess(Environment):
    """No launcher: plain `python train.py` (or `gpuwarden run -g 1 -- python train.py`)."""

    name = "single"

    @staticmethod
    def detect(environ: Mapping[str, str]) -> bool:
        return True

    @classmethod
    def read(cls, environ: Mapping[str, str]) -> Launch:
        return Launch(cls.name, 0, 0, 1, 1, "127.0.0.1", DEFAULT_PORT)


ENVIRONMENTS: tuple[type[Environment], ...] = (TorchElastic, Slurm, MPI, SingleProcess)


def detect(environ: Mapping[str, str] | None = None) -> Launch:
    """The first environment that recognises `environ` (default: os.environ)."""
    if environ is None:
        import os

        environ = os.environ
    for env in ENVIRONMENTS:
        if env.detect(environ):
            return env.read(environ)
    raise AssertionError("SingleProcess always matches")  # pragma: no cover


def _split_top(nodelist: str) -> Iterator[str]:
    depth, start = 0, 0
    for i, ch in enumerate(nodelist):
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
            if depth < 0:
                break
        elif ch == "," and depth == 0:
            yield nodelist[start:i]
            start = i + 1
    if depth != 0:
        raise UserError(f"Slurm nodelist {nodelist!r} has unbalanced brackets")
    yield nodelist[start:]


def _range_items(body: str, nodelist: str) -> list[str]:
    items: list[str] = []
    for part in body.split(","):
        lo, sep, hi = part.partition("-")
        if not is_digits(lo) or (sep and not is_digits(hi)):
            raise UserError(f"Slurm nodelist {nodelist!r}: cannot read range [{body}]")
        if not sep:
            items.append(lo)
            continue
        if int(hi) < int(lo):
            raise UserError(f"Slurm nodelist {nodelist!r}: range {part} runs backwards")
        items.extend(str(n).zfill(len(lo)) for n in range(int(lo), int(hi) + 1))
    return items


def expand_nodelist(nodelist: str) -> list[str]:
    """`node[01-03],gpu7` -> ['node01', 'node02', 'node03', 'gpu7'] (zero padding kept)."""
    import re  # here, not at import: only Slurm jobs read a nodelist

    hosts: list[str] = []
    for group in _split_top(nodelist.strip()):
        if not group:
            raise UserError(f"Slurm nodelist {nodelist!r} has an empty entry")
        names = [""]
        pos = 0
        for m in re.finditer(r"\[([^\[\]]*)\]", group):
            prefix = group[pos : m.start()]
            items = _range_items(m.group(1), nodelist)
            names = [n + prefix + item for n in names for item in items]
            pos = m.end()
        hosts.extend(n + group[pos:] for n in names)
    return hosts


def tasks_on_node(per_node: str, node: int) -> int:
    """This node's entry of Slurm's compressed task counts (`2(x3),1`: 2, 2, 2, 1)."""
    import re

    counts: list[int] = []
    for part in per_node.split(","):
        m = re.fullmatch(r"\s*(\d+)(?:\(x(\d+)\))?\s*", part)
        if not m:
            raise UserError(f"Slurm tasks per node {per_node!r} is not like '2(x3),1'")
        counts.extend([int(m.group(1))] * int(m.group(2) or 1))
    if not 0 <= node < len(counts):
        raise UserError(f"Slurm node id {node} is outside tasks per node {per_node!r}")
    return counts[node]


def first_host(nodelist: str) -> str:
    """The host of rank 0: Slurm places tasks in nodelist order."""
    return expand_nodelist(nodelist)[0]
