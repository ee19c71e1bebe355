"""The Python API: `gpuwarden.lease(...)` and `gpuwarden.select(...)`.

    import subprocess, gpuwarden

    with gpuwarden.lease(n=2, min_free="20GiB") as gpus:
        subprocess.run(["python", "train.py"], env=gpus.env, pass_fds=gpus.fds, check=True)

`lease` holds the GPUs for the `with` block in this process and changes
nothing global: the caller decides where the environment goes (a subprocess,
`os.environ` before importing torch). Pass `gpus.fds` to a subprocess that
should keep the lease should this process die. Where a queue service owns the
machine's GPUs, the service holds them for the block instead, as `salloc`
does (queueclient.holding): the block shows in `queue` as the caller's job, and
its end or this process's death frees them, unless a child given `gpus.fds` still
runs (the allocation's input and connection then live on in it). `select` answers "which
GPUs would I get" without reserving anything, like nvisel.

Arguments not given fall back to the configured `run.*` defaults, exactly as
for `gpuwarden run`, so scripts and the command line agree.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Optional, Union

from gpuwarden.base.errors import UserError
from gpuwarden.base.records import field, record
from gpuwarden.machine.inventory import Gpu, Snapshot

if TYPE_CHECKING:
    from gpuwarden.config import Config
    from gpuwarden.placement.request import Request

Ids = Union[str, int, Sequence[Union[str, int]], None]
SnapshotSource = Union[Snapshot, Callable[[], Snapshot], None]


@record
class Leased:
    """GPUs held for a `with gpuwarden.lease(...)` block."""

    gpus: tuple[Gpu, ...]
    job: str
    vars: dict[str, str]  # CUDA_VISIBLE_DEVICES, CUDA_DEVICE_ORDER, GPUWARDEN_* to set
    env: dict[str, str] = field(repr=False)  # the whole environment for a subprocess
    fds: tuple[int, ...] = ()  # lease descriptors, for `pass_fds=`
    mem: Optional[int] = None  # declared bytes of a shared lease
    #: Under a queue service: set when the allocation ends before the block does
    #: (cancelled, past its time limit, the service gone for good); None otherwise.
    ended: Optional[threading.Event] = field(default=None, repr=False, compare=False)

    @property
    def uuids(self) -> tuple[str, ...]:
        return tuple(g.uuid for g in self.gpus)

    @property
    def indices(self) -> tuple[int, ...]:
        """nvidia-smi indices; a MIG device's is its parent GPU's, which does not name
        it to CUDA: `visible` does."""
        return tuple(g.index for g in self.gpus)

    @property
    def visible(self) -> str:
        """The CUDA_VISIBLE_DEVICES value."""
        return self.vars["CUDA_VISIBLE_DEVICES"]

    def __iter__(self) -> Iterator[Gpu]:
        return iter(self.gpus)

    def __len__(self) -> int:
        return len(self.gpus)


def _ids(value: Ids) -> Optional[str]:
    if value is None:
        return None
    if isinstance(value, (str, int)):
        return str(value)
    return ",".join(str(v) for v in value)


def _request(
    n: Optional[int],
    gpus: Ids,
    min_free: Union[str, int, None],
    max_util: Optional[float],
    min_capability: Union[str, float, tuple[int, int], None],
    model: Optional[str],
    exclude: Ids,
    mem: Union[str, int, None],
    mig: Optional[str] = None,
) -> tuple[Config, Request]:
    """(the reading of the configuration with these arguments, the `request.Request`):
    the one reading everything on the way is handed, as `run` hands its own."""
    from gpuwarden import config
    from gpuwarden.base.units import parse_size
    from gpuwarden.placement.request import Request

    if n is not None and (isinstance(n, bool) or not isinstance(n, int) or n < 1):
        raise UserError(f"invalid n={n!r}: expected a whole number of GPUs, 1 or more")
    conf = config.load(
        {
            "run.count": n,
            "run.gpus": _ids(gpus),
            "run.min_free": min_free,
            "run.max_util": max_util,
            "run.min_capability": min_capability,
            "run.model": model,
            "run.exclude": _ids(exclude),
            "run.mig": mig,
        }
    )
    declared = None
    if mem is not None:
        if isinstance(mem, bool) or not isinstance(mem, (int, str)):
            raise UserError(f"invalid mem={mem!r}: expected bytes or a size such as 20GiB")
        declared = mem if isinstance(mem, int) else parse_size(mem)
        if declared <= 0:
            raise UserError(f"invalid mem={mem!r}: expected a size above zero")
    return conf, Request.from_config(conf, mem=declared)


def _set_here(base: Mapping[str, str], env: Mapping[str, str]) -> dict[str, str]:
    """`Leased.vars`: what `env` sets or changes over `base`, and every CUDA_ variable."""
    return {k: v for k, v in env.items() if base.get(k) != v or k.startswith("CUDA_")}


def _reader(snapshot: SnapshotSource, topology: bool) -> Callable[[], Snapshot]:
    if isinstance(snapshot, Snapshot):
        fixed = snapshot
        return lambda: fixed
    if snapshot is not None:
        return snapshot
    from gpuwarden.machine.inventory import read_snapshot

    return lambda: read_snapshot(processes=True, topology=topology)


@contextmanager
def hold(
    n: Optional[int] = None,
    *,
    gpus: Ids = None,
    min_free: Union[str, int, None] = None,
    max_util: Optional[float] = None,
    min_capability: Union[str, float, tuple[int, int], None] = None,
    model: Optional[str] = None,
    exclude: Ids = None,
    mem: Union[str, int, None] = None,
    mig: Optional[str] = None,
    wait: bool = False,
    timeout: Optional[float] = None,
    uuid: bool = False,
    environ: Optional[Mapping[str, str]] = None,
    snapshot: SnapshotSource = None,
    time: Union[str, float, None] = None,
    account: Optional[str] = None,
) -> Iterator[Leased]:
    """Hold `n` GPUs (default 1, or all of `gpus`) that fit the filters for the block.

    Sizes may be bytes or text (`"20GiB"`); `mem` asks for a shared lease declaring
    that much; `mig` a MIG slice of that profile (`"1g.10gb"`, docs/mig.md). Without
    `wait`, raises UserError (`exit_code` 75) when nothing fits
    now; with it, waits in line (first come, first served) up to `timeout` seconds.
    A request that can never fit raises at once. `environ` (default os.environ) is
    the base of `Leased.env`, and its CUDA_VISIBLE_DEVICES limits the choice.

    `time` (seconds, or `run --time`'s text: `"2h"`, `"1-00:00:00"`) is the block's
    time limit where a queue service holds the GPUs: past it the service ends the
    allocation (`Leased.ended` is set), as it ends a job past its `--time`, and a
    machine whose admin sets `service.max_time` needs one (or gives a default,
    `service.interactive_time`). Without a service nobody ends a block early, so
    `time` is not needed and not enforced there: the same script runs on a laptop.
    `account` (default `submit.account`) is the account the service charges the
    block's GPU-hours to (docs/usage.md); without a service it is not used.
    """
    conf, request = _request(n, gpus, min_free, max_util, min_capability, model, exclude, mem, mig)
    if request.count == 0:
        raise UserError("n=0 asks for no GPU; nothing to lease")
    limit = time_limit(time, "time")
    with _hold(
        conf, request, wait, timeout, uuid, environ, snapshot, limit, account=account
    ) as leased:
        yield leased


def time_limit(value: Union[str, float, None], what: str) -> Optional[float]:
    """Seconds of a `time=` given as seconds or as `run --time`'s text; None: none."""
    if value is None:
        return None
    if isinstance(value, bool):
        raise UserError(f"invalid {what}={value!r}: expected seconds or a duration such as 2h")
    if isinstance(value, (int, float)):
        if not 0 < value < 10 * 365 * 86400:
            raise UserError(f"invalid {what}={value!r}: expected seconds above zero")
        return float(value)
    from gpuwarden.base.units import parse_time_limit

    try:
        return parse_time_limit(value)
    except UserError as err:
        raise UserError(str(err).replace("--time", what, 1)) from None


@contextmanager
def _hold(
    conf: Config,
    request: Request,
    wait: bool = False,
    timeout: Optional[float] = None,
    uuid: bool = False,
    environ: Optional[Mapping[str, str]] = None,
    snapshot: SnapshotSource = None,
    time: Optional[float] = None,
    time_option: str = "gpuwarden.lease(time=...)",
    account: Optional[str] = None,
) -> Iterator[Leased]:
    """`hold` for a parsed request: through the queue service where `run` would go
    there, else leased here. `conf` is the one reading of the configuration everything
    on the way is handed (nothing below reads it again); `time` the service's time
    limit in seconds, `time_option` what a refusal for want of one names."""
    from gpuwarden.jobs import holding
    from gpuwarden.jobs.launch import job_env

    base = dict(os.environ if environ is None else environ)
    read = _reader(snapshot, topology=request.gpu_count > 1)
    face = holding.Face("lease", base, read=read, wait=wait, timeout=timeout, use_uuid=uuid)
    held = holding.hold(request, conf, face)
    if isinstance(held, holding.ByService):
        yield from allocated(
            request,
            held.socket,
            base,
            wait,
            timeout,
            uuid,
            read,
            conf,
            time,
            time_option,
            account or conf.get("submit.account"),
        )
        return
    if isinstance(held, holding.OnCpu):  # no driver, no GPU asked for: as `run`, no GPU
        import sys

        print(
            f"gpuwarden.lease: {held.reason}: the block runs with no GPU "
            "(n=1 would refuse instead)",
            file=sys.stderr,
        )
        env = job_env(base, ())
        yield Leased((), "", _set_here(base, env), env)
        return
    if isinstance(held, holding.Enclosed):  # inside a `run` job or `reserve` shell
        env = held.env
        yield Leased(held.gpus, held.job, _set_here(base, env), env, (), held.mem)
        return
    assert not isinstance(held, tuple)  # a dry run is not a face of the API
    lease = held  # a lease taken here
    holding.publish_here(lease, "python: gpuwarden.lease()")
    try:
        env = job_env(base, lease.gpus, use_uuid=uuid, job=lease.job, mem=lease.mem)
        yield Leased(lease.gpus, lease.job, _set_here(base, env), env, tuple(lease.fds), lease.mem)
    finally:
        lease.release()


def allocated(
    request: Request,
    path: str,
    base: dict[str, str],
    wait: bool,
    timeout: Optional[float],
    uuid: bool,
    read: Callable[[], Snapshot],
    conf: Config,
    time: Optional[float] = None,
    time_option: str = "time=",
    account: Optional[str] = None,
) -> Iterator[Leased]:
    """The block's GPUs held by the service, as `salloc` holds them (queueclient.holding):
    they show in `queue` as the caller's job, count against their limits and fair
    share, and are freed when the block ends or this process dies, unless a child
    given `fds` (the allocation's input and connection) still runs. `conf`: the
    caller's reading of the configuration."""
    from gpuwarden.jobs.launch import job_env
    from gpuwarden.queueclient import holding
    from gpuwarden.queueclient.client import job_fields

    fields = job_fields(request, holding.PLACEHOLDER, time_limit=time, account=account)
    with holding.hold(fields, path, wait, timeout, conf, time_option) as (job, uuids, fds, ended):
        by_uuid = {g.uuid: g for g in read().gpus}
        held = tuple(by_uuid[u] for u in uuids if u in by_uuid)
        env = job_env(base, held, use_uuid=uuid, job=str(job), mem=request.mem)
        ours = _set_here(base, env)
        yield Leased(held, str(job), ours, env, fds, request.mem, ended)


def pick(
    n: Optional[int] = None,
    *,
    gpus: Ids = None,
    min_free: Union[str, int, None] = None,
    max_util: Optional[float] = None,
    min_capability: Union[str, float, tuple[int, int], None] = None,
    model: Optional[str] = None,
    exclude: Ids = None,
    mem: Union[str, int, None] = None,
    mig: Optional[str] = None,
    environ: Optional[Mapping[str, str]] = None,
    snapshot: SnapshotSource = None,
) -> tuple[Gpu, ...]:
    """The GPUs `lease` would pick now, without reserving them: another job may take
    them before you do. Raises UserError (with the reason) when none fit."""
    from gpuwarden.jobs.allocation import choose_now
    from gpuwarden.jobs.holding import allowed
    from gpuwarden.leases import EXIT_BUSY

    base = os.environ if environ is None else environ
    conf, request = _request(n, gpus, min_free, max_util, min_capability, model, exclude, mem, mig)
    snap = _reader(snapshot, topology=request.gpu_count > 1)()
    choice = choose_now(snap, request, allowed(snap, base), conf)
    if not choice.ok:
        raise UserError(
            choice.error or "no GPU fits", exit_code=2 if choice.never_fits else EXIT_BUSY
        )
    return choice.gpus
