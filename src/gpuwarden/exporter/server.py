"""The Prometheus exporter: views read at most once per cache period, served over HTTP.

A scrape reads nothing: `Exposition` reads the machine every
`exporter.cache_seconds` on a thread of its own and keeps the rendered body, so
a scrape costs the same at 64 GPUs and 10,000 waiting jobs as at one GPU and
none. `ViewCache` keeps the last `View` (the machine view of `machineview`, plus
idle times and scrape errors) for that period, so the health watch and every
scraper share one NVML pass. The metric families are in `metrics`, the HTTP
server (shared with the web page) in `httpserver`.

prometheus-client is the `exporter` extra and imported only when serving.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, Optional

from gpuwarden.base.units import parse_listen
from gpuwarden.exporter.metrics import IdleTracker, View, families
from gpuwarden.health.judgement import DEFAULT_FATAL_XIDS, Rules
from gpuwarden.machine.inventory import Snapshot
from gpuwarden.monitoring.machineview import MachineView, read_view
from gpuwarden.web.httpserver import HttpServer
from gpuwarden.web.httpwire import Handler, HttpReply, HttpRequest

__all__ = ["Collector", "Exposition", "Server", "ViewCache", "require_client", "serve"]


# --- reading a view, cached ---------------------------------------------------


class ViewCache:
    """One `View` per `cache_seconds`, however many scrapers ask."""

    def __init__(
        self,
        read: Optional[Callable[[], Snapshot]] = None,
        *,
        cache_seconds: float = 2.0,
        idle_util: float = 1.0,
        idle_after: float = 600.0,
        rules: Any = None,
        clock: Callable[[], float] = time.monotonic,
        read_timeout: float = 5.0,
        counters: bool = False,
        show_commands: bool = False,
        socket: Optional[str] = None,
    ) -> None:
        self._read = read
        self.show_commands = show_commands
        self.socket = socket  # the queue service's, whose `stats` each view carries (None: none)
        # dcgm-exporter's further counters (`counters`), read with each snapshot
        # only when asked for: GPM keeps one sample per GPU between reads
        self._counters: Any = None
        if counters:
            from gpuwarden.exporter.counters import Counters

            self._counters = Counters()
        self.cache_seconds = cache_seconds
        self.idle_after = idle_after
        self.rules = rules
        self.read_timeout = read_timeout
        self._clock = clock
        self._idle = IdleTracker(idle_util)
        self._lock = threading.Lock()
        self._done = threading.Condition(self._lock)
        self._view: Optional[View] = None
        self._at = float("-inf")
        self._generation = 0  # completed reads
        self._reading = False
        self._stale: Optional[View] = None  # the last view, served while a read hangs
        self._machine: Optional[MachineView] = None  # the last read, for a reader that fails
        self.scrape_errors = 0
        self.reads = 0

    def snapshot(self) -> Snapshot:
        """The cached snapshot (for the health watch, so it costs no extra read)."""
        return self.get().snapshot

    def get(self) -> View:
        """The view, read again when older than `cache_seconds`. The read runs on its
        own thread: when it takes longer than `read_timeout` (NVML stuck on a failing
        GPU, a shared file that blocks) the last view is served with one more scrape
        error, so a scrape never hangs, and the read goes on in the background."""
        with self._lock:
            if self._view is not None and self._clock() - self._at < self.cache_seconds:
                return self._view
            if self._reading and self._stale is not None:
                return self._stale  # a read known to hang: do not wait for it again
            generation = self._generation
            if not self._reading:
                self._reading = True
                threading.Thread(target=self._refresh, name="gpuwarden-read", daemon=True).start()
            deadline = time.monotonic() + self.read_timeout
            while self._generation == generation:
                left = deadline - time.monotonic()
                if left <= 0:
                    return self._stuck()
                self._done.wait(left)
            if self._view is None:
                raise RuntimeError("the view could not be read")
            return self._view

    def _refresh(self) -> None:
        try:
            view: Optional[View] = self._fresh()
        except Exception:  # counted; the last view stays
            view = None
            self.scrape_errors += 1
        with self._lock:
            if view is not None:
                self._view, self._at, self._stale = view, self._clock(), None
            self._generation += 1
            self._reading = False
            self._done.notify_all()

    def _stuck(self) -> View:
        """Called with the lock held while a read hangs: one error per hung read."""
        if self._stale is None:
            self.scrape_errors += 1
            if self._view is not None:
                stale = replace(self._view, scrape_errors=self.scrape_errors)
            else:
                why = f"reading the GPUs took longer than {self.read_timeout:g}s"
                stale = View(_unread(why), scrape_errors=self.scrape_errors, nvml_up=False)
            self._stale = stale
        return self._stale

    def _fresh(self) -> View:
        started = time.perf_counter()
        self.reads += 1
        nvml_up = True
        try:
            snap = self._read_snapshot()
        except Exception as err:  # a whole read failed: serve what we had, count it
            self.scrape_errors += 1
            nvml_up = False
            snap = self._view.snapshot if self._view is not None else _unread(str(err))
        else:
            self.scrape_errors += sum(1 for g in snap.gpus if g.error is not None)
            nvml_up = snap.error is None
        machine = read_view(snap, rules=self.rules or Rules(), previous=self._machine)
        self._machine = machine
        self.scrape_errors += len(machine.failed)
        leased = (lease.uuid for lease in machine.leases)
        idle = self._idle.update(machine.snapshot, leased)
        from gpuwarden.queueclient.client import read_stats

        return View(
            snapshot=machine.snapshot,
            leases=machine.leases,
            drains=machine.drains,
            findings=machine.findings,
            xids=machine.xids,
            fatal_xids=getattr(self.rules, "fatal_xids", DEFAULT_FATAL_XIDS),
            idle_seconds=idle,
            idle_after=self.idle_after,
            scrape_errors=self.scrape_errors,
            read_seconds=time.perf_counter() - started,
            nvml_up=nvml_up,
            queue=read_stats(self.socket) if self.socket is not None else None,
            show_commands=self.show_commands,
        )

    def prime(self, gap: float = 0.5) -> None:
        """One read of the counters to measure from, `gap` seconds before the next
        (`--once`): GPM's ratios are averages between two samples, and a first read
        has none. Nothing to do without the counters."""
        if self._counters is not None:
            self._read_snapshot()
            time.sleep(gap)

    def _read_snapshot(self) -> Snapshot:
        if self._read is not None:
            return self._read()
        from gpuwarden.machine.inventory import read_snapshot

        return read_snapshot(counters=self._counters)


def _unread(why: str) -> Snapshot:
    """The snapshot of a machine not read yet: no GPUs, and why."""
    import socket

    return Snapshot(time.time(), socket.gethostname(), error=why)


class Collector:
    """The prometheus_client collector: one cached view per scrape."""

    def __init__(self, cache: ViewCache, dcgm_compat: bool = False) -> None:
        self.cache = cache
        self.dcgm_compat = dcgm_compat
        self.pinned: Optional[View] = None  # the view being rendered (Exposition)

    def collect(self):  # -> Iterator[Metric]
        yield from families(self.pinned or self.cache.get(), self.dcgm_compat)

    def describe(self):  # no fixed description: the registry must not call collect()
        return []


def require_client() -> None:
    """One line, not an ImportError traceback, when the `exporter` extra is missing."""
    from gpuwarden.base.errors import UserError

    try:
        import prometheus_client  # noqa: F401
    except ImportError:
        raise UserError(
            "the exporter needs prometheus-client: pip install 'gpuwarden[exporter]'"
        ) from None


# --- serving ------------------------------------------------------------------


@dataclass
class Server:
    """A running exporter: its address, cache and health watch."""

    host: str
    port: int
    cache: ViewCache
    httpd: Any
    thread: Any
    watch: Any = None
    exposition: Optional[Exposition] = None

    def close(self) -> None:
        if self.watch is not None:
            self.watch.stop()
        if self.exposition is not None:
            self.exposition.close()
        self.httpd.shutdown()
        self.httpd.server_close()


class Exposition:
    """The rendered /metrics body, kept per view and format.

    Once started (what `serve` does when `cache_seconds` is above 0) the machine is
    read on the exporter's own interval, as dcgm-exporter's collect interval: a
    thread of its own reads a view every `cache_seconds` and renders the text body
    as it reads, so a scrape is a lookup of bytes, never a read of the machine (NVML,
    leases, the queue service's `stats`) nor a render, however large the machine or
    the queue. When nothing has scraped for `LINGER` seconds the thread stops
    reading until the next scrape, which then reads, as a scrape with
    `cache_seconds = 0` always does."""

    #: Seconds without a scrape after which the machine is no longer read on the
    #: interval (a Prometheus scrape interval is well under this).
    LINGER = 300.0

    def __init__(
        self,
        cache: ViewCache,
        registry: Any,
        collector: Collector,
        dcgm_compat: bool = False,
    ) -> None:
        self.cache = cache
        self.registry = registry
        self.collector = collector
        self.dcgm_compat = dcgm_compat
        self._lock = threading.Lock()  # the view and its bodies
        self._rendering = threading.Lock()  # the collector's pinned view, while encoding
        self._bodies: dict[str, bytes] = {}
        self._view: Optional[View] = None
        self.waited = 0  # scrapes that waited for a read of the machine (counted: tests)
        self._scraped = time.monotonic()
        self._collecting = False
        self._parked = False  # no scrape for LINGER seconds: reads wait for one
        self._wake = threading.Event()
        self._stop = threading.Event()

    def start(self) -> None:
        """Read the machine every `cache_seconds` from now on, on a thread of its own."""
        self._collecting = True
        threading.Thread(target=self._collect, name="gpuwarden-collect", daemon=True).start()

    def close(self) -> None:
        self._stop.set()
        self._wake.set()

    def body(self, accept: Optional[str]) -> tuple[bytes, str]:
        from prometheus_client.exposition import choose_encoder

        encoder, content_type = choose_encoder(accept or "")
        with self._lock:
            self._scraped = time.monotonic()
            view = None if self._parked or not self._collecting else self._view
            body = None if view is None else self._bodies.get(content_type)
        if body is not None:
            return body, content_type
        if view is None:  # no reading kept: this scrape reads
            self.waited += 1
            view = self.cache.get()
            if self._parked:
                self._parked = False
                self._wake.set()
        return self._render(view, encoder, content_type), content_type

    def _render(self, view: View, encoder: Any, content_type: str) -> bytes:
        """`view` in one format, kept with it until the next view."""
        with self._rendering:
            self.collector.pinned = view
            try:
                body = encoder(self.registry)
            finally:
                self.collector.pinned = None
        if self.dcgm_compat and content_type.startswith("text/plain"):
            from gpuwarden.exporter.dcgm import typed

            body = typed(body)
        with self._lock:
            if view is not self._view:
                self._view, self._bodies = view, {}
            self._bodies[content_type] = body
        return body

    def _collect(self) -> None:
        """Read and render every `cache_seconds`, while scrapes come."""
        from prometheus_client.exposition import choose_encoder

        encoder, content_type = choose_encoder("")
        while not self._stop.is_set():
            started = time.monotonic()
            if started - self._scraped > self.LINGER:
                self._parked = True
                self._wake.wait()
                self._wake.clear()
                continue
            with contextlib.suppress(Exception):  # counted as scrape errors; the next may do
                self._render(self.cache.get(), encoder, content_type)
            self._stop.wait(max(0.0, started + self.cache.cache_seconds - time.monotonic()))


def _handler(exposition: Exposition) -> Handler:
    index = b'<html><body><a href="/metrics">metrics</a></body></html>'

    def handle(request: HttpRequest) -> HttpReply:
        if request.path == "/metrics":
            body, content_type = exposition.body(request.headers.get("accept"))
            return HttpReply(200, body, content_type)
        if request.path == "/":
            return HttpReply(200, index, "text/html")
        return HttpReply(404, b"not found\n", "text/plain")

    return handle


def serve(
    listen: str = "127.0.0.1:9400",
    *,
    dcgm_compat: bool = False,
    cache: Optional[ViewCache] = None,
    watch: Any = None,
) -> Server:
    """Start serving /metrics in a thread; raise UserError when the port is taken."""
    from gpuwarden.base.errors import UserError

    require_client()
    from prometheus_client import CollectorRegistry
    from prometheus_client.process_collector import ProcessCollector

    host, port = parse_listen(listen, any_port=True)
    cache = cache or ViewCache()
    registry = CollectorRegistry(auto_describe=False)
    collector = Collector(cache, dcgm_compat)
    registry.register(collector)  # type: ignore[arg-type]
    ProcessCollector(namespace="gpuwarden_exporter", registry=registry)
    exposition = Exposition(cache, registry, collector, dcgm_compat)
    try:
        httpd = HttpServer((host, port), _handler(exposition))
    except OSError as err:
        why = err.strerror or str(err)
        if getattr(err, "errno", None) == 98:
            why = "address already in use (another exporter running?)"
        raise UserError(f"cannot listen on {host}:{port}: {why}") from None
    real_port = httpd.server_address[1]
    thread = threading.Thread(target=httpd.serve_forever, name="gpuwarden-http", daemon=True)
    thread.start()
    if watch is not None:
        watch.start()
    if cache.cache_seconds > 0:
        exposition.start()  # the machine read on the interval, not per scrape
    return Server(host, real_port, cache, httpd, thread, watch, exposition)
