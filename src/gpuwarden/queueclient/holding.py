"""GPUs held through the queue service for a block of Python, as `salloc` holds them.

Where a service owns the GPUs, `gpuwarden.lease()` cannot take leases itself (the
service's lease directory is root's): it asks the service for an allocation
instead. That is an attached job whose process only waits for its standard input
to end (`PLACEHOLDER`): it runs as the caller, shows in `queue` as their running
job, counts against their limits and is charged to their fair share like any
other, and the service holds its GPUs (its supervisor holds the leases). The
block's end says so on that input and closes it, so the job completes; a holder
killed (`kill -9`) closes its connection with the service, which cancels the job, as
it cancels any attached job whose client went away. Either way the GPUs are free again.

A restart of the service ends no allocation, as it ends no attached `run`: a thread
reads the connection for the block's whole life, and when it drops it reconnects
and attaches to the job again (client._reattach, for up to `service.reconnect`;
a running job needs no terminal). The connection in `fds` is a descriptor of its
own that is pointed at each new connection, so a child started after a restart
(a notebook kernel's restart) gets the live one. `ended` is set when the job ends
before the block does (cancelled, past its time limit) or the service does not
come back.
"""

from __future__ import annotations

import contextlib
import os
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, Optional

from gpuwarden.base.errors import UserError
from gpuwarden.queueclient import protocol
from gpuwarden.queueclient.client import Client, _reattach, require

if TYPE_CHECKING:
    from gpuwarden.config import Config

#: The allocation's process. The block's end writes a line to its input, then closes
#: it: the line read, it waits for the input's end (a child given the descriptors
#: still holds it) and completes. An input that ends without the line is a holder
#: killed before its block could end: it waits then, for the service, which sees the
#: same holder's connection close, to cancel it. Both close as the holder dies, in
#: an order the kernel does not promise, so the line, not the order, tells them apart.
PLACEHOLDER = ["/bin/sh", "-c", "read _ && exec cat || exec sleep 2147483647", "gpuwarden.lease"]
#: `gpuwarden reserve`'s: the same, named so that `queue` and `release` tell it apart.
RESERVATION = [*PLACEHOLDER[:-1], "gpuwarden.reserve"]
#: What an older client's reservation runs (it completes at any end of its input).
OLDER_RESERVATION = ["/bin/sh", "-c", "read _ || :", "gpuwarden.reserve"]
EXIT_BUSY = 75


@contextmanager
def hold(
    fields: dict[str, Any],
    path: str,
    wait: bool,
    timeout: Optional[float],
    conf: Config,
    time_option: str = "time=",
    argv: Optional[list[str]] = None,
) -> Iterator[tuple[int, list[str], tuple[int, int], threading.Event]]:
    """(job id, GPU uuids, descriptors, set when it ended early) of an allocation held
    for the block. Without `wait`, raises UserError (exit 75) when nothing fits now;
    with it, waits up to `timeout` seconds. A child given the descriptors (the
    placeholder's input, then the connection) keeps the allocation until it ends too,
    as lease descriptors do. `conf` is the caller's reading of the configuration, for
    how long a dropped connection is tried again. A refusal
    for the time (`fields`' `time_limit`) names `time_option`, the caller's way to
    give one, where the service's says `--time`. `argv`: the allocation's process
    (PLACEHOLDER, or another waiting for its input's end in the same way)."""
    reconnect = float(conf.get("service.reconnect"))
    client = require(path)
    end_r, end_w = os.pipe2(os.O_CLOEXEC)
    null = os.open(os.devnull, os.O_RDWR | os.O_CLOEXEC)
    message = {**fields, "v": protocol.VERSION, "op": "submit", "attached": True, "wait": wait}
    message["argv"] = PLACEHOLDER if argv is None else argv
    try:
        socket.send_fds(client.sock, [protocol.encode(message)], [end_r, null, null])
        reply = client.receive()
        if not reply.get("ok"):
            error = str(reply.get("error") or "the service refused the allocation")
            raise UserError(_in_own_words(error, time_option))
        job = int(reply["job"])
        gpus = _started(client, job, timeout if wait else None)
    except BaseException:
        os.close(end_w)
        client.close()
        raise
    finally:
        os.close(end_r)
        os.close(null)
    follower = _Follower(job, client, reconnect)
    try:
        yield job, gpus, (end_w, follower.connection), follower.ended
    finally:
        with contextlib.suppress(OSError):  # ended already: cancelled, its time
            os.write(end_w, b"\n")  # the block's own end: it completes
        os.close(end_w)
        follower.ended.wait(30.0)
        follower.stop()


class _Follower:
    """The allocation's connection for the block's life: reads it (the service says
    nothing more but "ended"), and attaches again when a restart of the service drops
    it. `connection` is a descriptor of ours that always names the live connection."""

    def __init__(self, job: int, client: Client, within: float) -> None:
        self.job, self.client, self.within = job, client, within
        self.connection = os.dup(client.sock.fileno())
        self.ended = threading.Event()
        self._lock = threading.Lock()
        self._stopped = False
        threading.Thread(target=self._follow, name="gpuwarden-allocation", daemon=True).start()

    def _follow(self) -> None:
        try:
            while True:
                self.client.sock.settimeout(None)
                self.client.waiting = True
                try:
                    if self.client.receive().get("event") == "ended":
                        return
                    continue
                except UserError:
                    pass  # the connection dropped: the service restarts, or it is stopping
                with self._lock:
                    if self._stopped:
                        return
                again = _reattach(self.job, self.client, self.within, fds=())
                with self._lock:
                    if self._stopped:
                        again.close()
                        return
                    self.client = again
                    os.dup2(again.sock.fileno(), self.connection, inheritable=False)
        except (UserError, OSError):
            return  # the service did not come back: it ends the job when it does
        finally:
            self.ended.set()

    def stop(self) -> None:
        with self._lock:
            self._stopped = True
            os.close(self.connection)
            self.client.close()


def _in_own_words(error: str, option: str) -> str:
    """The service's refusal of a job's time (`needs --time`, `--time 2d is over`) with
    the caller's option for it in place of `--time`, which a kernel or
    `gpuwarden.lease()` has not: the refusal names the fix."""
    if error.startswith(("this machine needs --time", "--time ")):
        return error.replace("--time", option, 1)
    return error


def _started(client: Client, job: int, timeout: Optional[float]) -> list[str]:
    """Wait for the allocation's start; its GPUs."""
    client.waiting = True
    client.sock.settimeout(timeout)
    while True:
        try:
            event = client.receive()
        except TimeoutError:
            with contextlib.suppress(OSError):
                client.sock.sendall(
                    protocol.encode({"v": protocol.VERSION, "op": "cancel", "jobs": [job]})
                )
            raise UserError(
                f"gave up on allocation {job} after waiting {timeout:g}s for GPUs",
                exit_code=EXIT_BUSY,
            ) from None
        if event.get("event") == "started":
            return [str(u) for u in event.get("gpus") or ()]
        if event.get("event") == "ended":
            raise UserError(
                f"allocation {job}: {event.get('error') or 'ended before it started'}",
                exit_code=EXIT_BUSY if event.get("status") == EXIT_BUSY else 1,
            )


def is_reservation(command: object) -> bool:
    """Whether a job's command (a `queue` row's) is a `gpuwarden reserve` allocation's."""
    return command in (RESERVATION, OLDER_RESERVATION)
