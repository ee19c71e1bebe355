"""A Jupyter kernel provisioner that gives each kernel its own GPU lease.

A kernelspec written by `gpuwarden kernel install` names this provisioner
(`"kernel_provisioner": {"provisioner_name": "gpuwarden", "config": {...}}`), so every
kernel started from it, by JupyterLab, `jupyter console` or `KernelManager`:

* leases its GPUs before it starts (the same request and rules as `gpuwarden run`), and
  sees exactly them: CUDA_VISIBLE_DEVICES, CUDA_DEVICE_ORDER and GPUWARDEN_* are set in
  its environment before its Python starts, so before anything imports torch;
* holds the lease in its own process (the lock descriptors are inherited, as a job of
  `gpuwarden run` holds them): if the Jupyter server dies, the kernel keeps its GPUs
  for as long as it runs;
* keeps the same GPUs across a restart: the provisioner holds its own copy of the lease
  while the old kernel stops and the new one starts, and the lease record then names
  the new kernel;
* frees them when it is shut down, and when it dies any other way (killed, the
  enforcer's idle policy, a crash): a thread waits for the kernel process and lets the
  lease go unless a restart was asked for.

The lease is taken directly on this machine (the lease directory), as `gpuwarden run`
takes it without a queue service. Where a queue service runs, it owns the leases: the
provisioner then holds the GPUs through it as `gpuwarden.lease()` does (an allocation,
queueclient.holding) for the kernel's whole life, and starts the kernel with the
allocation's descriptors, which keep it as the lease's descriptors do. A restart keeps
the allocation, so the new kernel gets the same GPUs even while another job waits for
them; a new job per kernel start could lose them to it. Errors (nothing free, a request
that never fits) are `UserError`s with the same one-line messages as the command line;
Jupyter shows them as the kernel's failure to start.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Optional, Union

from jupyter_client.provisioning import LocalProvisioner
from traitlets import Any as AnyTrait
from traitlets import Bool, Dict

if TYPE_CHECKING:
    from gpuwarden.config import Config
    from gpuwarden.leases import Held
    from gpuwarden.placement.request import Request

# The request's fields in the kernelspec's provisioner config: the names of
# gpuwarden.lease()'s arguments (api.hold), as `gpuwarden kernel install` writes them.
REQUEST_KEYS = ("n", "gpus", "min_free", "max_util", "min_capability", "model", "exclude", "mem")


class GpuwardenProvisioner(LocalProvisioner):  # type: ignore[misc]
    """LocalProvisioner plus a GPU lease for the kernel's life (see the module's text)."""

    request = Dict(config=True, help="the GPUs to lease: gpuwarden.lease()'s arguments")
    # Not `wait`/`timeout`: those names are the provisioner's own methods and settings.
    wait_for_gpus = Bool(False, config=True, help="wait in line for the GPUs, not fail")
    wait_timeout = AnyTrait(None, config=True, help="seconds to wait at most, or None")
    uuid = Bool(False, config=True, help="CUDA_VISIBLE_DEVICES as UUIDs")
    # Not `time`: a kernel's time limit under a queue service (`kernel install --time`).
    time_limit = AnyTrait(None, config=True, help="the kernel's time limit: seconds or 8h")
    account = AnyTrait(None, config=True, help="the account its GPU-hours are charged to")

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._held: Union[Held, _Allocation, _Nothing, None] = None
        self._vars: dict[str, str] = {}
        self._lock = threading.Lock()
        self._stopping = False  # the manager is stopping the kernel (for a restart or not)
        self._current: Optional[int] = None  # the kernel process that holds the lease now

    # -- the lease --------------------------------------------------------------------

    def _request(self) -> tuple[Config, Request]:
        """gpuwarden.lease()'s arguments from the kernelspec, checked: (the reading of the
        configuration with them, the request), read once for each start of a kernel."""
        from gpuwarden.base.errors import UserError
        from gpuwarden.jobs.api import _request

        unknown = sorted(set(self.request) - set(REQUEST_KEYS))
        if unknown:
            raise UserError(f"gpuwarden kernel: unknown request field(s): {', '.join(unknown)}")
        conf, request = _request(*(self.request.get(k) for k in REQUEST_KEYS))
        if request.count == 0:
            raise UserError("gpuwarden kernel: n=0 asks for no GPU")
        return conf, request

    def _timeout(self) -> Optional[float]:
        return None if self.wait_timeout is None else float(self.wait_timeout)

    def _hold(
        self, environ: dict[str, str], base: dict[str, str], conf: Config, request: Request
    ) -> None:
        """The kernel's GPUs, as `jobs.holding.hold` decides for every face: through the
        queue service (`_allocate`), an enclosing lease's (a Jupyter server started in a
        `reserve` shell), a lease taken here (prepared now, published with the kernel's
        pid), or none (no driver here and no GPU asked for: the kernel runs on the CPU,
        as `gpuwarden run` would run it). `environ` is the server's environment, which
        names an enclosing lease; `base` the kernel's, without GPUWARDEN_ variables of
        another job."""
        from gpuwarden.jobs import holding
        from gpuwarden.jobs.api import _reader
        from gpuwarden.jobs.launch import job_env

        face = holding.Face(
            "kernel",
            environ,
            read=_reader(None, topology=request.gpu_count > 1),
            wait=self.wait_for_gpus,
            timeout=self._timeout(),
            use_uuid=self.uuid,
        )
        held = holding.hold(request, conf, face)
        if isinstance(held, holding.ByService):
            self._allocate(held.socket, base, conf, request)
        elif isinstance(held, holding.OnCpu):
            self._held, self._vars = _Nothing(), job_env({}, ())
        elif isinstance(held, holding.Enclosed):
            self._held = _Nothing(tuple(g.uuid for g in held.gpus))
            ours = ("CUDA_", "GPUWARDEN_")
            self._vars = {k: v for k, v in held.env.items() if k.startswith(ours)}
        else:
            assert not isinstance(held, tuple)  # a lease taken here
            lease = held
            try:
                env = job_env({}, lease.gpus, use_uuid=self.uuid, job=lease.job, mem=lease.mem)
                lease.prepare(f"jupyter kernel {self.kernel_spec.display_name}")
            except BaseException:
                lease.release()
                raise
            self._held, self._vars = lease, env

    def _release(self) -> None:
        with self._lock:
            held, self._held = self._held, None
            self._current = None
        if held is not None:
            held.release()

    def _watch(self, pid: int) -> None:
        """Wait (without reaping: Popen does that) for the kernel to end; let the lease go
        when it ended of itself (killed, crashed, the enforcer's idle policy). When the
        manager stopped it, `cleanup` decides: kept for a restart, else let go."""
        with contextlib.suppress(ChildProcessError):  # already reaped: it ended
            os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT)
        with self._lock:
            asked = self._stopping or self._current != pid
        if not asked:
            self._release()

    # -- the provisioner's steps ------------------------------------------------------

    def _allocate(self, socket: str, base: dict[str, str], conf: Config, request: Request) -> None:
        """The GPUs held through the queue service at `socket` for the kernel's life
        (until `_release`), as `gpuwarden.lease()` holds them: an allocation in `queue`."""
        from gpuwarden.jobs.api import _reader, allocated, time_limit

        limit = time_limit(self.time_limit, "time_limit")
        stack = contextlib.ExitStack()
        leased = stack.enter_context(
            contextlib.contextmanager(allocated)(
                request,
                socket,
                base,
                self.wait_for_gpus,
                self._timeout(),
                self.uuid,
                _reader(None, topology=request.gpu_count > 1),
                conf,
                limit,
                "`gpuwarden kernel install --time`",
                str(self.account) if self.account is not None else conf.get("submit.account"),
            )
        )
        assert leased.ended is not None  # a service's allocation says when it ends
        allocation = _Allocation(stack, leased.uuids, leased.fds, leased.ended)
        allocation.job, allocation.socket = int(leased.job), socket
        self._held, self._vars = allocation, dict(leased.vars)
        threading.Thread(
            target=self._guard, args=(allocation,), name="gpuwarden-allocation", daemon=True
        ).start()

    def _guard(self, allocation: _Allocation) -> None:
        """End the kernel when its allocation ends before the provisioner lets it go (the
        job cancelled, past its time, released by the enforcer's idle policy, or the
        service gone and not back within `service.reconnect`): the kernel never keeps
        GPUs the service no longer holds for it. A restart of the service is not an end:
        the allocation's connection attaches again (queueclient.holding)."""
        import signal

        allocation.ended.wait()
        with self._lock:
            if self._held is not allocation:
                return  # let go here: the kernel has ended
            pid = self._current
        if pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        self._release()

    async def pre_launch(self, **kwargs: Any) -> dict[str, Any]:
        kwargs = await super().pre_launch(**kwargs)
        from gpuwarden.jobs.launch import OURS

        environ = dict(kwargs.get("env") or os.environ)
        env = {k: v for k, v in environ.items() if k not in OURS}
        with self._lock:
            fresh = self._held is None
        if fresh:
            conf, request = self._request()
            self._hold(environ, env, conf, request)
        env.update(self._vars)
        kwargs["env"] = env
        assert self._held is not None  # held above, or kept across a restart
        kwargs["pass_fds"] = tuple(self._held.fds)
        return kwargs

    async def launch_kernel(self, cmd: list[str], **kwargs: Any) -> Any:
        try:
            info = await super().launch_kernel(cmd, **kwargs)
        except BaseException:
            self._release()
            raise
        from gpuwarden.leases import Held

        held = self._held
        assert self.pid is not None  # the kernel has started
        if isinstance(held, _Allocation):  # into the job's cgroup, as a batch job's
            try:
                held.confine(self.pid)
            except BaseException:
                await self.kill()
                self._release()
                raise
        if isinstance(held, Held):  # a service's allocation is a job of its own
            if self._current is not None:  # a restart: the lease is published already
                held.repoint(self.pid)
            else:
                held.publish(self.pid)
        with self._lock:
            self._stopping = False
            self._current = self.pid
        threading.Thread(
            target=self._watch, args=(self.pid,), name="gpuwarden-kernel", daemon=True
        ).start()
        return info

    async def shutdown_requested(self, restart: bool = False) -> None:
        with self._lock:
            self._stopping = True  # cleanup() says whether for a restart
        await super().shutdown_requested(restart=restart)

    async def kill(self, restart: bool = False) -> None:
        with self._lock:
            self._stopping = True  # cleanup() says whether for a restart
        await super().kill(restart=restart)

    async def terminate(self, restart: bool = False) -> None:
        with self._lock:
            self._stopping = True  # cleanup() says whether for a restart
        await super().terminate(restart=restart)

    async def cleanup(self, restart: bool = False) -> None:
        await super().cleanup(restart=restart)
        if not restart:
            self._release()

    def gpus(self) -> Optional[tuple[str, ...]]:
        """The UUIDs of the GPUs this kernel holds now (None: none)."""
        held = self._held
        return None if held is None else held.uuids


class _Nothing:
    """No lease of the kernel's own: the CPU, or GPUs an enclosing lease holds (`uuids`)."""

    fds: tuple[int, ...] = ()

    def __init__(self, uuids: tuple[str, ...] = ()) -> None:
        self.uuids = uuids

    def release(self) -> None:
        pass


class _Allocation:
    """GPUs held through the queue service, shaped as a direct lease (`uuids`, `fds`,
    `release`) for the provisioner."""

    def __init__(
        self,
        stack: contextlib.ExitStack[Optional[bool]],
        uuids: tuple[str, ...],
        fds: Sequence[int],
        ended: threading.Event,
    ) -> None:
        self._stack, self.uuids, self.fds = stack, uuids, tuple(fds)
        self.ended: threading.Event = ended  # set when the job ended before `release`
        self.job, self.socket = 0, ""  # the allocation's job, and its service's socket

    def confine(self, pid: int) -> None:
        """Move the kernel `pid` into the allocation's cgroup (service.joining), where
        only its GPUs can be opened, as a batch job's processes are; UserError if the
        service refuses (the kernel must not run outside it)."""
        from gpuwarden.queueclient.client import require

        with require(self.socket) as client:
            client.call("join", job=self.job, pid=pid)

    def release(self) -> None:
        self._stack.close()  # the allocation's input closes: the job completes
