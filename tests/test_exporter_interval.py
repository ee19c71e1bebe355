"""/metrics reads nothing per scrape: the machine (NVML, leases, the queue service's
`stats`) is read on the exporter's own interval and a scrape is served the body
rendered then. Guarded by counts, which a busy machine does not move: machine
reads and `stats` calls per scrape, and scrapes that waited for a read."""

from __future__ import annotations

import threading
import time
import urllib.request
from dataclasses import replace

import pytest

from gpuwarden.exporter.server import Exposition, ViewCache, serve
from machines import busy_box
from scraping import samples, value
from waiting import wait_for

pytest.importorskip("prometheus_client")


def scrape(port: int, accept: str = "") -> str:
    request = urllib.request.Request(f"http://127.0.0.1:{port}/metrics")
    if accept:
        request.add_header("Accept", accept)
    with urllib.request.urlopen(request, timeout=10) as reply:
        return reply.read().decode()


def test_scrapes_read_neither_the_machine_nor_the_service(monkeypatch):
    """Before: every scrape past the cache period waited for a whole read of the
    machine and asked the service for `stats` (20 scrapes here: 20 reads)."""
    from gpuwarden.queueclient import client

    asked = []
    monkeypatch.setattr(client, "read_stats", lambda *a, **k: asked.append(1))
    reads = []
    release = threading.Event()

    def read():
        reads.append(threading.current_thread().name)
        if len(reads) > 2:  # NVML slow on a failing GPU: no scrape may wait for it
            release.wait(60)
        return busy_box()

    cache = ViewCache(read, cache_seconds=0.05, read_timeout=60, socket="/nonexistent/sock")
    server = serve("127.0.0.1:0", cache=cache)
    try:
        assert server.exposition is not None
        wait_for(lambda: len(reads) >= 3, 30, "reads on the interval", 0.01)
        for _ in range(20):
            text = scrape(server.port)  # would wait 60 s behind the hung read before
            time.sleep(0.06)  # past the interval each time
        assert value(samples(text), "gpuwarden_gpu_memory_used_bytes", gpu="0") > 0
        assert len(reads) == 3 and len(asked) == 2  # two whole reads; the third hangs
        assert server.exposition.waited == 0  # no scrape waited for a read
    finally:
        release.set()
        server.close()


def test_a_later_scrape_sees_what_the_interval_read():
    used = [1 << 30]

    def read():
        snap = busy_box()
        first = replace(snap.gpus[0], memory_used=used[0])
        return replace(snap, gpus=[first, *snap.gpus[1:]])

    server = serve("127.0.0.1:0", cache=ViewCache(read, cache_seconds=0.05))
    try:
        wait_for(lambda: "gpuwarden_gpu_memory_used_bytes" in scrape(server.port), 30, "a body")
        assert value(samples(scrape(server.port)), "gpuwarden_gpu_memory_used_bytes", gpu="0") == (
            1 << 30
        )
        used[0] = 5 << 30

        def seen() -> bool:
            found = samples(scrape(server.port))
            return value(found, "gpuwarden_gpu_memory_used_bytes", gpu="0") == 5 << 30

        wait_for(seen, 30, "the next reading in a scrape", 0.02)
        # OpenMetrics, asked by Prometheus, from the same reading
        open_text = scrape(server.port, "application/openmetrics-text; version=1.0.0")
        assert open_text.rstrip().endswith("# EOF")
    finally:
        server.close()


def test_without_scrapes_the_interval_reads_stop_until_the_next_scrape(monkeypatch):
    monkeypatch.setattr(Exposition, "LINGER", 0.2)
    reads = []

    def read():
        reads.append(1)
        return busy_box()

    server = serve("127.0.0.1:0", cache=ViewCache(read, cache_seconds=0.02))
    try:
        assert server.exposition is not None
        exposition = server.exposition
        wait_for(lambda: exposition._parked, 30, "reads to stop without scrapes", 0.01)
        parked = len(reads)
        time.sleep(0.3)
        assert len(reads) == parked  # none while nobody scrapes
        assert "gpuwarden_gpu_memory_used_bytes" in scrape(server.port)  # this one reads
        assert exposition.waited == 1
        wait_for(lambda: len(reads) >= parked + 3, 30, "the interval reads again", 0.01)
    finally:
        server.close()


def test_cache_zero_reads_on_every_scrape_as_configured():
    reads = []

    def read():
        reads.append(1)
        return busy_box()

    server = serve("127.0.0.1:0", cache=ViewCache(read, cache_seconds=0))
    try:
        for _ in range(3):
            scrape(server.port)
        assert len(reads) == 3
    finally:
        server.close()
