"""Other hosts' pages on this one (`gpuwarden web --peers URL...`): each peer's own
`/api/v1/state`, read once per interval by one thread of this server, summed up into
the document's `peers` list (a row per GPU), so every open page gets the whole lab
without a browser ever talking to another host. Nothing new runs on a peer: it serves
its page as before.

A peer is trusted to be a page, not to be well-formed: its answer is read with a size
and time bound, every field through `web.values` (bounded text, finite numbers), and
a peer that does not answer in time is a row saying why, while the rest stay live.
"""

from __future__ import annotations

import threading
import urllib.parse
from collections.abc import Sequence
from typing import Any

from gpuwarden.base.errors import UserError
from gpuwarden.web.values import finite, text

MAX_BYTES = 8 << 20  # a page of 64 GPUs with an hour of history is well under this
GPUS_SHOWN = 64  # rows per peer
READ_TIMES = 3  # a whole answer within this many times the per-read timeout


def check_url(value: str) -> str:
    """A peer's page as given (`http://gpu2:9500/`), made its base URL; one line when it
    is not an http(s) address of a page (no credentials, no query)."""
    parts = urllib.parse.urlsplit(value.strip())
    if (
        parts.scheme not in ("http", "https")
        or not parts.hostname
        or parts.username is not None
        or parts.query
        or parts.fragment
        or any(c.isspace() or not c.isprintable() for c in value)
    ):
        raise UserError(f"--peers needs page addresses such as http://gpu2:9500/, got {value!r}")
    try:
        parts.port  # noqa: B018 (raises on a port that is not one)
    except ValueError:
        raise UserError(f"--peers: not a port in {value!r}") from None
    return urllib.parse.urlunsplit((parts.scheme, parts.netloc, parts.path.rstrip("/"), "", ""))


def summary(url: str, doc: Any) -> dict[str, Any]:
    """One peer's row group from its state document (pure): a line per GPU."""
    if not isinstance(doc, dict) or doc.get("api") != 1 or not isinstance(doc.get("gpus"), list):
        return failed(url, "answered with something that is not a gpuwarden page's state")
    gpus = []
    for gpu in doc["gpus"][:GPUS_SHOWN]:
        if not isinstance(gpu, dict):
            continue
        health = gpu.get("health")
        people = [p for p in (gpu.get("processes"), gpu.get("leases")) if isinstance(p, list)]
        users = sorted(
            {text(x.get("user"), 64) for xs in people for x in xs if isinstance(x, dict)}
        )
        index = gpu.get("index")
        gpus.append(
            {
                "index": index if isinstance(index, int) and not isinstance(index, bool) else None,
                "name": text(gpu.get("name"), 64) or None,
                "utilization": finite(gpu.get("utilization")),
                "memory_used": finite(gpu.get("memory_used")),
                "memory_total": finite(gpu.get("memory_total")),
                "temperature": finite(gpu.get("temperature")),
                "health": text(health.get("level"), 16) if isinstance(health, dict) else None,
                "drained": isinstance(gpu.get("drain"), dict),
                "users": [u for u in users if u],
            }
        )
    return {
        "url": url,
        "hostname": text(doc.get("hostname"), 64) or None,
        "error": text(doc["error"]) if doc.get("error") else None,
        "taken_at": finite(doc.get("taken_at")),
        "gpus": gpus,
    }


def failed(url: str, why: str) -> dict[str, Any]:
    return {"url": url, "hostname": None, "error": text(why), "taken_at": None, "gpus": []}


def fetch(url: str, timeout: float) -> dict[str, Any]:
    """A peer's summary now, or a row saying why there is none."""
    import time
    import urllib.request

    from gpuwarden.queueclient.depth import TooDeep, loads

    request = urllib.request.Request(url + "/api/v1/state", headers={"Accept": "application/json"})
    deadline = time.monotonic() + READ_TIMES * timeout  # a peer that trickles is slow too
    chunks: list[bytes] = []
    size = 0
    try:
        with urllib.request.urlopen(request, timeout=timeout) as reply:
            while size <= MAX_BYTES:
                if time.monotonic() > deadline:
                    return failed(url, f"answered too slowly (over {READ_TIMES * timeout:g} s)")
                chunk = reply.read1(65536)
                if not chunk:
                    break
                chunks.append(chunk)
                size += len(chunk)
    except OSError as err:  # refused, unreachable, timed out, an HTTP error status
        reason = getattr(err, "reason", None) or getattr(err, "strerror", None) or err
        return failed(url, f"not answering: {reason}")
    if size > MAX_BYTES:
        return failed(url, f"answered with more than {MAX_BYTES} bytes")
    try:
        return summary(url, loads(b"".join(chunks)))
    except TooDeep as err:
        return failed(url, f"answered JSON {err}")
    except ValueError:
        return failed(url, "did not answer with JSON")


class PeerWatch:
    """Asks every peer once per interval, together, in threads of its own: a slow peer
    delays its own row only, never this host's GPUs or the other peers."""

    def __init__(self, urls: Sequence[str], interval: float, timeout: float = 3.0) -> None:
        self.urls = list(urls)
        self.interval = interval
        self.timeout = timeout
        self.rows: dict[str, dict[str, Any]] = {u: failed(u, "not asked yet") for u in urls}
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []

    def latest(self) -> list[dict[str, Any]]:
        """The last answer of each peer, in the order given; asked now without threads
        (`web --once`)."""
        if not self._threads:
            self.rows = {u: fetch(u, self.timeout) for u in self.urls}
        return [self.rows[u] for u in self.urls]

    def start(self) -> PeerWatch:
        for url in self.urls:
            thread = threading.Thread(target=self._loop, args=(url,), daemon=True)
            thread.name = "gpuwarden-web-peer"
            self._threads.append(thread)
            thread.start()
        return self

    def _loop(self, url: str) -> None:
        while True:
            try:
                self.rows[url] = fetch(url, self.timeout)
            except Exception as err:  # a peer's answer must never end its row's thread
                self.rows[url] = failed(url, f"answered what this page cannot read ({err!r})")
            if self._stop.wait(self.interval):
                return

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(self.timeout + 5)
