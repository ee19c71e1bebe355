"""The page's HTTP server: one sampler shared by every client, read-only routes.

`Feed` reads the machine once per interval (snapshot, leases, drains, XID log,
wait line, and the queue service's queue and fair share when one runs), keeps
the last hour in a `History`, builds the API document with `model.build` and
encodes it once; every page — by server-sent events (`/api/v1/events`) or by
polling `/api/v1/state` — gets those same bytes. So
fifty open pages cost fifty socket writes a second, not fifty NVML reads (nor
fifty questions to the queue service).

The server is the exporter's (`gpuwarden.web.httpserver`: one selector thread, a
few workers) with the page's bounds: at most `max_clients` connections at once
(past it the oldest idle one makes room; with every one an open page, the
newcomer is answered 503 at once), `timeout` seconds for a slow or silent
client, GET and HEAD only (anything else 405), and, while bound to loopback,
only loopback `Host` names (a page on another site cannot read it through DNS
rebinding). Malformed requests get a 4xx, never a traceback. An events stream
is sent the new document when the feed has one (`Feed.listeners`).
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, Optional

from gpuwarden.base.errors import UserError
from gpuwarden.base.units import LOOPBACK, parse_listen
from gpuwarden.machine.inventory import Snapshot
from gpuwarden.web.history import History
from gpuwarden.web.httpserver import HttpServer
from gpuwarden.web.httpwire import Handler, HttpReply, HttpRequest
from gpuwarden.web.model import build

HERE = os.path.dirname(os.path.abspath(__file__))
STATIC = {  # path -> (file under web/, content type)
    "/": ("static/index.html", "text/html; charset=utf-8"),
    "/app.js": ("static/app.js", "text/javascript; charset=utf-8"),
    "/style.css": ("static/style.css", "text/css; charset=utf-8"),
    "/api/v1/schema": ("schema/state-v1.json", "application/schema+json"),
}
HEADERS = {
    # Scripts and styles come from this server only; data never becomes markup.
    "Content-Security-Policy": "default-src 'self'; img-src 'self' data:; frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
}
KEEPALIVE = 15.0  # seconds between SSE comments on a quiet stream (proxies drop idle ones)


class Feed:
    """The latest API document, re-read every `interval` seconds by one thread."""

    def __init__(
        self,
        *,
        interval: float = 1.0,
        show_commands: bool = False,
        read: Optional[Callable[[], Snapshot]] = None,
        rules: Any = None,
        watch: Any = None,
        history: Optional[History] = None,
        log: Optional[Callable[[str], None]] = None,
        service: Optional[str] = None,
        service_timeout: Optional[float] = None,
        peers: Sequence[str] = (),
    ) -> None:
        self.interval = interval
        # Other hosts' pages (`--peers`), each asked by a thread of its own.
        self.peers: Any = None
        if peers:
            from gpuwarden.web.peers import PeerWatch

            self.peers = PeerWatch(peers, interval, timeout=min(5.0, max(1.0, interval * 2)))
        # The queue service's socket (None: none asked), asked by a thread of its own.
        self.service: Any = None
        if service is not None:
            from gpuwarden.web.queue import DEFAULT_TIMEOUT, QueuePoller

            self.service = QueuePoller(service, interval, service_timeout or DEFAULT_TIMEOUT)
        self.show_commands = show_commands
        self.rules = rules
        self.watch = watch
        self.history = history or History()
        if log is None:  # through logging: the CLI sets its format and level (--log-level)
            import logging

            log = logging.getLogger("gpuwarden.web").warning
        self.log = log
        self._read = read
        self._cond = threading.Condition()
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self.listeners: list[Callable[[], None]] = []  # told of each new document
        self.seq = 0
        self.body = b""
        self.snap: Optional[Snapshot] = None
        self.samples = 0

    # -- gathering -------------------------------------------------------------

    def snapshot(self) -> Snapshot:
        """The last snapshot read (for the health watch: no second NVML read)."""
        if self.snap is None:
            self.sample()
        assert self.snap is not None
        return self.snap

    def sample(self) -> None:
        doc = self.document()
        body = json.dumps(doc, separators=(",", ":"), allow_nan=False).encode()
        with self._cond:
            self.body = body
            self.seq += 1
            self._cond.notify_all()
        for listener in self.listeners:
            listener()

    def document(self) -> dict[str, Any]:
        """Read everything once and build the API document (also what `--once` prints)."""
        from gpuwarden.health.judgement import Rules
        from gpuwarden.jobs.allocation import describe_request
        from gpuwarden.monitoring.machineview import read_view

        rules = self.rules or Rules()
        view = read_view(self._read_snapshot(), rules=rules)
        snap = self.snap = view.snapshot
        self.samples += 1
        self.history.add(snap)
        watch = None
        if self.watch is not None:
            watch = {"running": True, "listening": bool(getattr(self.watch, "listening", False))}
        return build(
            snap,
            leases=view.leases,
            drains=view.drains,
            findings=view.findings,
            xid_events=view.xid_events,
            waiters=_soft(_waiters, []),
            history=self.history.series(),
            watch=watch,
            now=time.time(),
            interval=self.interval,
            show_commands=self.show_commands,
            describe=describe_request,
            fatal_xids=rules.fatal_xids,
            service=self._ask_service(),
            peers=self.peers.latest() if self.peers is not None else (),
        )

    def _ask_service(self) -> Optional[dict[str, Any]]:
        return None if self.service is None else self.service.latest()

    def _read_snapshot(self) -> Snapshot:
        try:
            if self._read is not None:
                return self._read()
            from gpuwarden.machine.inventory import read_snapshot

            return read_snapshot()
        except Exception as err:  # a failed read: show why, keep serving
            if self.snap is not None:
                return self.snap
            return Snapshot(time.time(), socket.gethostname(), error=f"cannot read GPUs: {err}")

    # -- the loop --------------------------------------------------------------

    def start(self) -> Feed:
        if self.service is not None:
            self.service.start()
        if self.peers is not None:
            self.peers.start()
        if self.seq == 0:
            self.sample()  # the first request must not find an empty document
        self._thread = threading.Thread(target=self._loop, name="gpuwarden-web-feed", daemon=True)
        self._thread.start()
        return self

    def _loop(self) -> None:
        next_at = time.monotonic() + self.interval
        while not self._stop.wait(max(0.0, next_at - time.monotonic())):
            next_at += self.interval
            if next_at < time.monotonic():  # fell behind (a slow read): do not burst
                next_at = time.monotonic() + self.interval
            try:
                self.sample()
            except Exception as err:  # keep serving the last document
                self.log(f"sample failed: {type(err).__name__}: {err}")

    def stop(self) -> None:
        self._stop.set()
        with self._cond:
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join(5)
        if self.service is not None:
            self.service.stop()
        if self.peers is not None:
            self.peers.stop()

    def latest(self) -> tuple[int, bytes]:
        with self._cond:
            return self.seq, self.body


def _soft(read: Callable[[], Any], default: Any) -> Any:
    """One source failing (an unreadable lease or state directory) costs its section only."""
    try:
        return read()
    except Exception:
        return default


def _waiters() -> list:
    from gpuwarden.files.locations import lease_location
    from gpuwarden.leases.dir import open_dir
    from gpuwarden.leases.waitline import read_line

    where = lease_location()
    if not os.path.lexists(where):
        return []
    return read_line(open_dir(where, create=False))


# --- HTTP ------------------------------------------------------------------------------


def is_loopback(host: str) -> bool:
    """A loopback address or `localhost` ("127.0.0.1.nip.io" is a name, not an address)."""
    import ipaddress

    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _host_name(header: str) -> str:
    """The name in a Host header, without the port ("[::1]:80" -> "::1")."""
    if header.startswith("["):
        return header[1:].split("]", 1)[0]
    return header.rsplit(":", 1)[0] if header.count(":") == 1 else header


class Pages:
    """The static files, read once at start (they are part of the package)."""

    def __init__(self) -> None:
        self.files: dict[str, tuple[bytes, str]] = {}
        for route, (name, kind) in STATIC.items():
            with open(os.path.join(HERE, name), "rb") as fh:
                self.files[route] = (fh.read(), kind)


def _routes(feed: Feed, pages: Pages, loopback_only: bool) -> Handler:
    def handle(request: HttpRequest) -> HttpReply:
        host = request.headers.get("host")  # browsers always send it; scripts may not
        if loopback_only and host is not None and not is_loopback(_host_name(host)):
            return HttpReply(400, b"this page answers to localhost only\n", close=True)
        if request.path == "/api/v1/state":
            return HttpReply(200, feed.latest()[1], "application/json", NO_STORE)
        if request.path == "/api/v1/events":
            return HttpReply(
                200, content_type="text/event-stream", headers=NO_STORE, stream=PageEvents(feed)
            )
        if request.path in pages.files:
            body, kind = pages.files[request.path]
            return HttpReply(200, body, kind, {"Cache-Control": "no-cache"})
        return HttpReply(404, b"not found\n", close=True)

    return handle


NO_STORE = {"Cache-Control": "no-store"}


class PageEvents:
    """Server-sent events: each new document as one `data:` line, a comment when
    quiet for `KEEPALIVE` seconds (proxies drop idle streams)."""

    keepalive = KEEPALIVE
    ping = b": keep-alive\n\n"

    def __init__(self, feed: Feed) -> None:
        self.feed = feed
        self.seq: Optional[int] = None

    def poll(self) -> bytes:
        seq, body = self.feed.latest()
        if self.seq is None:
            self.seq = seq
            return b"retry: %d\ndata: %s\n\n" % (int(self.feed.interval * 1000), body)
        if seq == self.seq:
            return b""
        self.seq = seq
        return b"data: %s\n\n" % body


class WebServer:
    """A running page: address, feed, optional health watch; `close()` stops all."""

    def __init__(self, httpd: HttpServer, feed: Feed, watch: Any = None) -> None:
        self.httpd = httpd
        self.feed = feed
        self.watch = watch
        self.host, self.port = httpd.server_address[:2]
        self._thread = threading.Thread(
            target=httpd.serve_forever, name="gpuwarden-web-http", daemon=True
        )
        self._thread.start()

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}/"

    def close(self) -> None:
        if self.watch is not None:
            self.watch.stop()
        self.feed.stop()
        self.httpd.shutdown()
        self.httpd.server_close()


def serve(
    listen: str = "127.0.0.1:9500",
    *,
    feed: Optional[Feed] = None,
    watch: Any = None,
    max_clients: int = 64,
    timeout: float = 30.0,
) -> WebServer:
    """Start the page in threads; UserError when the address cannot be served."""
    host, port = parse_listen(listen, any_host=LOOPBACK, any_port=True)
    if max_clients < 1:
        raise UserError(f"web.max_clients must be at least 1, got {max_clients}")
    feed = feed or Feed()
    routes = _routes(feed, Pages(), is_loopback(host))
    try:
        httpd = HttpServer(
            (host, port),
            routes,
            max_connections=max_clients,
            request_timeout=timeout,
            write_timeout=timeout,
            headers=HEADERS,
        )
    except OSError as err:
        why = err.strerror or str(err)
        raise UserError(f"cannot listen on {host}:{port}: {why}") from None
    feed.listeners.append(httpd.notify)
    feed.start()
    if watch is not None:
        watch.start()
    return WebServer(httpd, feed, watch)
