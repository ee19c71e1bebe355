"""The page's HTTP server: one sampler shared by every client, read-only routes.

`Feed` reads the machine once per interval (snapshot, leases, drains, XID log,
wait line, and the queue service's queue and fair share when one runs), keeps
the last hour in a `History`, builds the API document with `model.build` and
encodes it once; every page — by server-sent events (`/api/v1/events`) or by
polling `/api/v1/state` — gets those same bytes. So
fifty open pages cost fifty socket writes a second, not fifty NVML reads (nor
fifty questions to the queue service).

The server is `http.server.ThreadingHTTPServer` with bounds: at most
`max_clients` connections at once (one more is answered 503 and closed, after
waiting up to `SLOT_WAIT` for a slot: a connection its client has just closed
holds its slot until its thread has run, which on a busy machine may come after
the client's next connection), a
socket timeout for slow or silent clients, GET and HEAD only (anything else
405), and, while bound to loopback, only loopback `Host` names (a page on
another site cannot read it through DNS rebinding). Malformed requests get a
4xx from `BaseHTTPRequestHandler` or from here, never a traceback.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable, Optional

from gpuwarden.errors import UserError
from gpuwarden.inventory import Snapshot
from gpuwarden.units import LOOPBACK, parse_listen
from gpuwarden.web.history import History
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


def _warn(message: str) -> None:
    # Through logging: the CLI sets its format and level once (--log-level).
    import logging

    logging.getLogger("gpuwarden.web").warning(message)


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
        log: Callable[[str], None] = _warn,
        service: Optional[str] = None,
        service_timeout: Optional[float] = None,
    ) -> None:
        self.interval = interval
        # The queue service's socket (None: none asked), asked by a thread of its own.
        self.service: Any = None
        if service is not None:
            from gpuwarden.web.queue import DEFAULT_TIMEOUT, ServiceWatch

            self.service = ServiceWatch(service, interval, service_timeout or DEFAULT_TIMEOUT)
        self.show_commands = show_commands
        self.rules = rules
        self.watch = watch
        self.history = history or History()
        self.log = log
        self._read = read
        self._cond = threading.Condition()
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
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

    def document(self) -> dict[str, Any]:
        """Read everything once and build the API document (also what `--once` prints)."""
        from gpuwarden.allocation import describe_request
        from gpuwarden.health import Rules, judge
        from gpuwarden.xidlog import xid_events

        snap = self._read_snapshot()
        leases = _soft(_leases, [])
        if leases:
            from gpuwarden.attribution import attribute

            snap = attribute(snap, leases)  # a container's processes shown as their owner's
        self.snap = snap
        self.samples += 1
        self.history.add(snap)
        events = _soft(xid_events, [])
        xids: dict[str, list[int]] = {}
        for event in events:
            try:
                xids.setdefault(str(event["uuid"]), []).append(int(event["xid"]))
            except (KeyError, TypeError, ValueError):
                continue
        rules = self.rules or Rules()
        findings = {g.uuid: judge(g, tuple(xids.get(g.uuid, ())), rules=rules) for g in snap.gpus}
        watch = None
        if self.watch is not None:
            watch = {"running": True, "listening": bool(getattr(self.watch, "listening", False))}
        return build(
            snap,
            leases=leases,
            drains=_soft(_drains, {}),
            findings=findings,
            xid_events=events,
            waiters=_soft(_waiters, []),
            history=self.history.series(),
            watch=watch,
            now=time.time(),
            interval=self.interval,
            show_commands=self.show_commands,
            describe=describe_request,
            fatal_xids=rules.fatal_xids,
            service=self._ask_service(),
        )

    def _ask_service(self) -> Optional[dict[str, Any]]:
        return None if self.service is None else self.service.latest()

    def _read_snapshot(self) -> Snapshot:
        try:
            if self._read is not None:
                return self._read()
            from gpuwarden.inventory import read_snapshot

            return read_snapshot()
        except Exception as err:  # a failed read: show why, keep serving
            if self.snap is not None:
                return self.snap
            return Snapshot(time.time(), socket.gethostname(), error=f"cannot read GPUs: {err}")

    # -- the loop --------------------------------------------------------------

    def start(self) -> Feed:
        if self.service is not None:
            self.service.start()
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

    @property
    def stopped(self) -> bool:
        return self._stop.is_set()

    def latest(self) -> tuple[int, bytes]:
        with self._cond:
            return self.seq, self.body

    def wait_newer(self, seq: int, timeout: float) -> tuple[int, bytes]:
        """The document after `seq`, or the same one after `timeout` or on stop."""
        with self._cond:
            self._cond.wait_for(lambda: self.seq != seq or self._stop.is_set(), timeout)
            return self.seq, self.body


def _soft(read: Callable[[], Any], default: Any) -> Any:
    """One source failing (an unreadable lease or state directory) costs its section only."""
    try:
        return read()
    except Exception:
        return default


def _leases() -> list:
    from gpuwarden.leases import list_leases

    return list_leases()


def _drains() -> dict:
    from gpuwarden.drain import list_drains

    return list_drains()


def _waiters() -> list:
    from gpuwarden.leasedir import open_dir
    from gpuwarden.locations import lease_location
    from gpuwarden.waitline import read_line

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


def _handler(feed: Feed, pages: Pages, loopback_only: bool, timeout: float) -> type:
    class Handler(BaseHTTPRequestHandler):
        def version_string(self) -> str:  # no Python version for the curious
            return "gpuwarden-web"

        protocol_version = "HTTP/1.1"
        # Errors found before the request line's version is read (a garbled line, a
        # TLS handshake) would otherwise get HTTP/0.9's answer: a body with no status.
        default_request_version = "HTTP/1.0"
        # Headers and body leave in two writes; with Nagle's algorithm the second
        # waits for the client's delayed ACK (~40 ms) on a kept-alive connection.
        disable_nagle_algorithm = True

        def setup(self) -> None:
            self.timeout = timeout
            super().setup()

        def parse_request(self) -> bool:
            if not super().parse_request():
                return False
            if self.command not in ("GET", "HEAD"):
                self._plain(405, "read-only: GET and HEAD only\n", {"Allow": "GET, HEAD"})
                return False
            host = self.headers.get("Host")  # browsers always send it; scripts may not
            if loopback_only and host is not None and not is_loopback(_host_name(host)):
                self._plain(400, "this page answers to localhost only\n")
                return False
            return True

        def do_HEAD(self) -> None:
            self.do_GET()

        def do_GET(self) -> None:
            path = self.path.split("?", 1)[0]
            if path == "/api/v1/state":
                self._send(200, feed.latest()[1], "application/json", cache=False)
            elif path == "/api/v1/events":
                self._events()
            elif path in pages.files:
                body, kind = pages.files[path]
                self._send(200, body, kind, cache=True)
            else:
                self._plain(404, "not found\n")

        def _plain(self, status: int, message: str, extra: Optional[dict] = None) -> None:
            self.close_connection = True
            self._send(status, message.encode(), "text/plain; charset=utf-8", False, extra)

        def _send(
            self,
            status: int,
            body: bytes,
            kind: str,
            cache: bool,
            extra: Optional[dict] = None,
        ) -> None:
            self.send_response(status)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(body)))
            self.send_header("Cache-Control", "no-cache" if cache else "no-store")
            for name, value in {**HEADERS, **(extra or {})}.items():
                self.send_header(name, value)
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)

        def _events(self) -> None:
            """Server-sent events: each new document as one `data:` line, until the
            page goes away or the server stops."""
            self.close_connection = True
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Cache-Control", "no-store")
            for name, value in HEADERS.items():
                self.send_header(name, value)
            self.end_headers()
            if self.command == "HEAD":
                return
            retry = int(feed.interval * 1000)
            seq, body = feed.latest()
            try:
                self.wfile.write(b"retry: %d\ndata: %s\n\n" % (retry, body))
                while not feed.stopped:
                    new, body = feed.wait_newer(seq, KEEPALIVE)
                    if feed.stopped:
                        break
                    if new == seq:
                        self.wfile.write(b": keep-alive\n\n")
                    else:
                        seq = new
                        self.wfile.write(b"data: %s\n\n" % body)
            except OSError:  # the page closed, or stopped reading (socket timeout)
                return

        def log_message(self, *args: Any) -> None:  # page loads are not news
            pass

    return Handler


SLOT_WAIT = 0.1  # seconds a connection over the limit waits for a slot before its 503


class _Server(ThreadingHTTPServer):
    """ThreadingHTTPServer with a ceiling on connections (each is a thread)."""

    daemon_threads = True
    request_queue_size = 64

    def __init__(self, address: tuple[str, int], handler: type, max_clients: int) -> None:
        self.slots = threading.BoundedSemaphore(max_clients)
        super().__init__(address, handler)

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self.slots.acquire(timeout=SLOT_WAIT):
            with contextlib.suppress(OSError):
                request.sendall(
                    b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\n"
                    b"Retry-After: 5\r\nConnection: close\r\n\r\n"
                )
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self.slots.release()
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self.slots.release()

    def handle_error(self, request: Any, client_address: Any) -> None:
        # A client that vanished mid-answer is normal; anything else is a bug worth a line.
        err = sys.exc_info()[1]
        if not isinstance(err, OSError):
            _warn(f"error answering {client_address[0]}: {type(err).__name__}: {err}")


class WebServer:
    """A running page: address, feed, optional health watch; `close()` stops all."""

    def __init__(self, httpd: _Server, feed: Feed, watch: Any = None) -> None:
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
    handler = _handler(feed, Pages(), is_loopback(host), timeout)
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    server_class = type("Server", (_Server,), {"address_family": family})
    try:
        httpd = server_class((host, port), handler, max_clients)
    except OSError as err:
        why = err.strerror or str(err)
        raise UserError(f"cannot listen on {host}:{port}: {why}") from None
    feed.start()
    if watch is not None:
        watch.start()
    return WebServer(httpd, feed, watch)
