"""The HTTP server of the exporter and the web page: one selector thread, a small
fixed worker pool.

`http.server.ThreadingHTTPServer` starts a thread per connection and keeps it as
long as the client keeps the socket open, with a listen backlog of 5: 5,000 idle
connections made 5,000 threads (161 MB) and held scrapes up for 30 s, and 50
concurrent scrapers saw a p99 near 1 s from refused SYNs. Here one thread
watches every socket with `selectors` and only a fixed pool of workers builds
responses, so:

* threads are bounded (1 + `workers`) however many clients connect;
* a client must send its whole request head within `request_timeout` seconds
  of connecting (or of its previous answer, with keep-alive) and read the answer
  within `write_timeout`, else it is dropped: idle and trickling clients cost a
  file descriptor for a few seconds, never a thread;
* past `max_connections` the oldest connection still waiting for its request is
  dropped to make room, so a flood of idle sockets cannot lock Prometheus out;
  when every connection is busy (open event streams), the newcomer is answered
  503 at once instead of waiting in a queue;
* the backlog is 128, so bursts of scrapers wait in the kernel's queue instead
  of being refused and retried a second later.

Only what a read-only endpoint needs is spoken: GET and HEAD (HEAD is GET without
the body), HTTP/1.0 and 1.1 with keep-alive; other methods get 405, a malformed
request head 400, an overlong one 414 (request line) or 431 (headers), another
HTTP version 505. Request bodies are never read: a request that announces one is
answered and the connection closed. After an answer that closes the connection,
what the client still sends is read and dropped for a moment (a lingering close),
so a reset cannot overtake the answer.

A handler answers an `HttpRequest` with an `HttpReply` (both in `httpwire`, with the
parsing); a reply with a `stream` (the web page's server-sent events) keeps its
connection, without a length, and the loop sends what the stream has new
whenever `notify()` is called, and its `ping` when it has been quiet for
`keepalive` seconds.
"""

from __future__ import annotations

import collections
import contextlib
import errno
import queue
import selectors
import socket
import threading
import time
from collections.abc import Callable, Mapping
from typing import Optional

from gpuwarden.web.httpwire import (
    Handler,
    HttpReply,
    HttpRequest,
    Stream,
    encode,
    has_body,
    parse_head,
    wants_close,
)

MAX_HEAD = 16 * 1024  # a scrape's or a page's request head is a few hundred bytes
LINGER = 2.0  # seconds a closing connection's unread input is still read and dropped


class _Conn:
    """One client: what it sent, what it is owed, and until when it may take."""

    __slots__ = (
        "busy",
        "close_after",
        "deadline",
        "events",
        "inbox",
        "lingering",
        "outbox",
        "sock",
        "stream",
    )

    def __init__(self, sock: socket.socket, deadline: float) -> None:
        self.sock = sock
        self.inbox = b""
        self.outbox = b""
        self.deadline = deadline
        self.busy = False  # a worker is building its answer
        self.close_after = False
        self.events = 0  # what the selector watches for (0: not registered)
        self.stream: Optional[Stream] = None  # an answer that goes on
        self.lingering = False  # answered and shut for writing: input is dropped


class HttpServer:
    """Serve `handler` on (host, port) until `shutdown()`; `serve_forever` runs the loop."""

    def __init__(
        self,
        address: tuple[str, int],
        handler: Handler,
        *,
        backlog: int = 128,
        workers: int = 4,
        max_connections: int = 512,
        request_timeout: float = 5.0,
        write_timeout: float = 10.0,
        headers: Optional[Mapping[str, str]] = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        host, port = address
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((host, port))
            sock.listen(backlog)
            sock.setblocking(False)
        except OSError:
            sock.close()
            raise
        self.socket = sock
        self.server_address = sock.getsockname()[:2]
        self.handler = handler
        self.max_connections = max(1, _fd_room(max_connections))
        self.request_timeout = request_timeout
        self.write_timeout = write_timeout
        self.headers = dict(headers or {})  # sent with every answer, errors too
        self._clock = clock
        # daemon workers, so a render stuck on a hostile file never holds up exit
        self._jobs: queue.Queue = queue.Queue()
        self._workers = [
            threading.Thread(target=self._work, name=f"gpuwarden-http-{i}", daemon=True)
            for i in range(max(1, workers))
        ]
        for worker in self._workers:
            worker.start()
        self._selector = selectors.DefaultSelector()
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self._done: collections.deque = collections.deque()  # (conn, answer bytes, close)
        # oldest first; a dict keeps insertion order, and eviction takes the oldest idle
        self._conns: dict[socket.socket, _Conn] = {}
        self._stop = threading.Event()
        self._stopped = threading.Event()
        self._stopped.set()
        self._notified = False
        self.turns = 0  # loop iterations: the tests check that an idle loop sleeps

    # --- the loop -------------------------------------------------------------

    def serve_forever(self) -> None:
        self._stopped.clear()
        sel = self._selector
        sel.register(self.socket, selectors.EVENT_READ, None)
        sel.register(self._wake_r, selectors.EVENT_READ, None)
        try:
            while not self._stop.is_set():
                self.turns += 1
                for key, mask in sel.select(timeout=self._next_timeout()):
                    if key.fileobj is self.socket:
                        self._accept()
                    elif key.fileobj is self._wake_r:
                        self._drain_wakeups()
                    else:
                        conn = key.data
                        if mask & selectors.EVENT_READ:
                            self._read(conn)
                        if mask & selectors.EVENT_WRITE and conn.sock in self._conns:
                            self._write(conn)
                self._expire()
        finally:
            for conn in list(self._conns.values()):
                self._close(conn)
            sel.unregister(self.socket)
            sel.unregister(self._wake_r)
            self._stopped.set()

    def shutdown(self) -> None:
        """Stop the loop and wait for it (as `socketserver.BaseServer.shutdown`)."""
        self._stop.set()
        self._wake()
        self._stopped.wait()

    def notify(self) -> None:
        """Something new for the streams: any thread may call it."""
        self._notified = True
        self._wake()

    def server_close(self) -> None:
        for _ in self._workers:
            self._jobs.put(None)
        for sock in (self.socket, self._wake_r, self._wake_w):
            sock.close()
        self._selector.close()

    @property
    def connections(self) -> int:
        return len(self._conns)

    def _next_timeout(self) -> float:
        if not self._conns:
            return 1.0
        soonest = min(c.deadline for c in self._conns.values())
        return min(1.0, max(0.0, soonest - self._clock()))

    def _accept(self) -> None:
        for _ in range(64):  # a burst at a time, so the others get a turn
            try:
                sock, _addr = self.socket.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as err:
                if err.errno in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                    # out of descriptors: make room, the client stays in the backlog
                    if not self._evict():
                        return
                    continue
                return  # ECONNABORTED and the like: that client is gone
            if len(self._conns) >= self.max_connections and not self._evict():
                _refuse(sock)
                continue
            sock.setblocking(False)
            with contextlib.suppress(OSError):  # streams write small pieces: no Nagle delay
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            conn = _Conn(sock, self._clock() + self.request_timeout)
            self._conns[sock] = conn
            self._watch(conn, read=True)

    def _evict(self) -> bool:
        """Drop the oldest connection still waiting for its request head."""
        for conn in self._conns.values():
            if not conn.busy and not conn.outbox and conn.stream is None:
                self._close(conn)
                return True
        return False

    def _expire(self) -> None:
        now = self._clock()
        for conn in [c for c in self._conns.values() if c.deadline <= now]:
            if conn.stream is not None and not conn.outbox and not conn.lingering:
                self._send(conn, conn.stream.ping, close=False)  # quiet: a keep-alive
            else:
                self._close(conn)

    def _close(self, conn: _Conn) -> None:
        if self._conns.pop(conn.sock, None) is None:
            return
        if conn.events:
            self._selector.unregister(conn.sock)
            conn.events = 0
        conn.sock.close()

    def _read(self, conn: _Conn) -> None:
        try:
            data = conn.sock.recv(65536)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            self._close(conn)
            return
        if conn.lingering or conn.stream is not None:
            if not data:
                self._close(conn)
            return  # a request on a stream, or after the last answer: not read
        if not data:
            if conn.inbox and not conn.busy and not conn.outbox:  # half a request, then EOF
                self._send(conn, self._error(400, b"bad request\n"), close=True)
            elif not conn.busy:
                self._close(conn)
            else:  # answer it anyway, then close (a half-closed client may still read)
                conn.close_after = True
                self._watch(conn, read=False)
            return
        if conn.busy or conn.outbox:
            # pipelined: keep it until the current answer is out (bounded like a head)
            if len(conn.inbox) + len(data) > MAX_HEAD:
                conn.close_after = True
                self._watch(conn, read=False, write=bool(conn.outbox))
                return
            conn.inbox += data
            return
        conn.inbox += data
        self._next_request(conn)

    def _next_request(self, conn: _Conn) -> None:
        """Start answering the request waiting in `conn.inbox`, if it is complete."""
        end = conn.inbox.find(b"\r\n\r\n")
        if end < 0:
            if len(conn.inbox) > MAX_HEAD:
                if b"\r\n" in conn.inbox:
                    answer = self._error(431, b"request head too large\n")
                else:
                    answer = self._error(414, b"request line too long\n")
                self._send(conn, answer, close=True)
            return
        head, conn.inbox = conn.inbox[:end], conn.inbox[end + 4 :]
        request = parse_head(head)
        if request is None:
            self._send(conn, self._error(400, b"bad request\n"), close=True)
            return
        method, path, version, headers = request
        if not version.startswith("HTTP/1."):
            self._send(conn, self._error(505, b"HTTP/1.0 and 1.1 only\n"), close=True)
            return
        close = wants_close(version, headers) or has_body(headers)
        if method not in ("GET", "HEAD"):
            allow = {"Allow": "GET, HEAD"}
            answer = self._error(405, b"read-only: GET and HEAD only\n", allow)
            self._send(conn, answer, close=True)
            return
        conn.busy = True
        conn.deadline = float("inf")  # the answer's own deadline starts when it is ready
        self._watch(conn, read=True)  # to notice a hang-up
        self._jobs.put((conn, HttpRequest(method, path, headers), close))

    def _error(self, status: int, body: bytes, extra: Optional[Mapping[str, str]] = None) -> bytes:
        return encode(HttpReply(status, body, headers={**self.headers, **(extra or {})}), True)

    def _work(self) -> None:
        """A worker: build answers and hand them to the loop."""
        while True:
            job = self._jobs.get()
            if job is None:
                return
            conn, request, close = job
            try:
                reply = self.handler(request)
            except Exception:  # a bug in rendering costs this answer, not the server
                reply = HttpReply(500, b"internal error\n")
            if self.headers:
                reply = HttpReply(
                    reply.status,
                    reply.body,
                    reply.content_type,
                    {**self.headers, **reply.headers},
                    reply.close,
                    reply.stream,
                )
            head_only = request.method == "HEAD"
            close = close or reply.close or (reply.stream is not None and head_only)
            answer = encode(reply, close, head_only=head_only)
            stream = None if head_only else reply.stream
            if stream is not None:
                answer += stream.poll()
            self._done.append((conn, answer, close, stream))
            self._wake()

    def _drain_wakeups(self) -> None:
        try:
            while self._wake_r.recv(4096):
                pass
        except (BlockingIOError, InterruptedError):
            pass
        while self._done:
            conn, answer, close, stream = self._done.popleft()
            if conn.sock not in self._conns:
                continue  # the client left meanwhile
            conn.busy = False
            conn.stream = stream
            conn.inbox = b"" if stream is not None else conn.inbox
            self._send(conn, answer, close)
        if self._notified:
            self._notified = False
            for conn in list(self._conns.values()):
                stream = conn.stream
                if stream is not None and not conn.lingering:
                    news = stream.poll()
                    if news:
                        self._send(conn, news, close=False)

    def _send(self, conn: _Conn, answer: bytes, close: bool) -> None:
        conn.close_after = conn.close_after or close
        conn.outbox += answer
        conn.deadline = self._clock() + self.write_timeout
        self._write(conn)

    def _write(self, conn: _Conn) -> None:
        try:
            sent = conn.sock.send(conn.outbox)
        except (BlockingIOError, InterruptedError):
            sent = 0
        except OSError:
            self._close(conn)
            return
        conn.outbox = conn.outbox[sent:]
        if conn.outbox:
            self._watch(conn, read=False, write=True)
            return
        if conn.close_after:
            self._linger(conn)
            return
        if conn.stream is not None:
            conn.deadline = self._clock() + conn.stream.keepalive
            self._watch(conn, read=True)
            return
        conn.deadline = self._clock() + self.request_timeout
        self._watch(conn, read=True)
        if conn.inbox:
            self._next_request(conn)

    def _linger(self, conn: _Conn) -> None:
        """Shut the answered connection for writing and drop what the client still
        sends until it closes (or `LINGER` passes): closing with unread input would
        send a reset, which may reach the client before the answer does."""
        try:
            conn.sock.shutdown(socket.SHUT_WR)
        except OSError:
            self._close(conn)
            return
        conn.lingering = True
        conn.inbox = b""
        conn.deadline = self._clock() + LINGER
        self._watch(conn, read=True)

    def _watch(self, conn: _Conn, read: bool, write: bool = False) -> None:
        """Watch `conn` for exactly these events (none: a hung-up client owed an answer)."""
        events = (selectors.EVENT_READ if read else 0) | (selectors.EVENT_WRITE if write else 0)
        if conn.sock not in self._conns or events == conn.events:
            return
        if not events:
            self._selector.unregister(conn.sock)
        elif conn.events:
            self._selector.modify(conn.sock, events, conn)
        else:
            self._selector.register(conn.sock, events, conn)
        conn.events = events

    def _wake(self) -> None:
        try:
            self._wake_w.send(b"x")
        except (BlockingIOError, InterruptedError):
            pass  # already pending: one byte is enough
        except OSError:
            pass  # closed: the server is going away


def _refuse(sock: socket.socket) -> None:
    """Every connection busy: say so at once rather than queue the newcomer."""
    with contextlib.suppress(OSError):
        sock.setblocking(False)
        sock.send(
            b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\n"
            b"Retry-After: 5\r\nConnection: close\r\n\r\n"
        )
    sock.close()


def _fd_room(wanted: int) -> int:
    """At most `wanted` connections, and fewer when RLIMIT_NOFILE leaves no room."""
    try:
        import resource

        soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    except (ImportError, OSError, ValueError):  # pragma: no cover - not on Linux
        return wanted
    if soft == resource.RLIM_INFINITY:
        return wanted
    return min(wanted, soft - 64)
