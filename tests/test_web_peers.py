"""`gpuwarden web --peers URL...`: other hosts' pages on this one, from their own JSON
API. The peer is a real `gpuwarden web` process on its own simulated machine; a peer
that does not answer is a row saying so, and the page's document stays valid."""

from __future__ import annotations

import contextlib
import http.client
import http.server
import json
import socket
import threading
import time

import jsonschema
import pytest

from gpuwarden.base.errors import UserError
from gpuwarden.web.peers import PeerWatch, check_url, summary
from gpuwarden.web.server import Feed, WebServer, serve
from ports import free_port
from schemas import WEB_STATE
from waiting import wait_for


def _state(server: WebServer) -> dict:
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
    try:
        conn.request("GET", "/api/v1/state")
        return json.loads(conn.getresponse().read())
    finally:
        conn.close()


def test_a_peer_page_shows_on_this_one_and_a_silent_peer_is_one_row(sim, peer) -> None:
    sim("server-8xa100")
    peers = [check_url(peer), check_url(f"http://127.0.0.1:{free_port()}/")]  # as the CLI
    server = serve("127.0.0.1:0", feed=Feed(interval=0.2, peers=peers), max_clients=4)
    try:

        def both_asked() -> dict:
            doc = _state(server)
            asked = doc["peers"][0]["gpus"] and doc["peers"][1]["error"] != "not asked yet"
            return doc if asked else {}

        doc = wait_for(both_asked, 20, lambda: f"both peers asked: {_state(server)['peers']}", 0.1)
    finally:
        server.close()
    jsonschema.validate(doc, WEB_STATE)
    assert len(doc["gpus"]) == 8  # this host's own GPUs are untouched
    first, second = doc["peers"]
    assert first["url"] == peers[0] and first["error"] is None
    assert first["hostname"] == socket.gethostname()
    assert [g["index"] for g in first["gpus"]] == [0, 1, 2]
    assert first["gpus"][1]["users"] == ["dave"] and first["gpus"][1]["utilization"] == 99
    assert second["gpus"] == [] and second["error"].startswith("not answering: ")


def test_peer_addresses_and_answers_are_checked() -> None:
    assert check_url("http://gpu2:9500/") == "http://gpu2:9500"
    assert check_url("https://lab.example/gpus/") == "https://lab.example/gpus"
    for bad in (
        "gpu2:9500",
        "file:///etc/passwd",
        "http://u:p@gpu2/",
        "http://gpu2/?x=1",
        "http://gpu2:99999/",
    ):
        with pytest.raises(UserError, match="--peers"):
            check_url(bad)
    odd = summary(
        "http://x",
        {
            "api": 1,
            "hostname": "x" * 500,
            "gpus": [{"index": True, "utilization": float("nan"), "processes": [{"user": 3}]}, 7],
        },
    )
    jsonschema.validate(
        {"peers": [odd]}, {"properties": {"peers": WEB_STATE["properties"]["peers"]}}
    )
    assert odd["gpus"][0]["index"] is None and odd["gpus"][0]["utilization"] is None
    assert len(odd["hostname"]) == 64 and odd["gpus"][0]["users"] == ["3"]
    assert summary("http://x", [1, 2])["error"].startswith("answered with something")


class _Hostile(http.server.BaseHTTPRequestHandler):
    """A peer that answers `[` x 100,000 at /nested/ and trickles a byte every 0.3 s at
    /slow/; a good state at /nested/ once `fixed` is set."""

    fixed = False

    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        if self.path.startswith("/nested/"):
            body = {"api": 1, "hostname": "mended", "gpus": []} if _Hostile.fixed else None
            self.wfile.write(json.dumps(body).encode() if body else b"[" * 100000 + b"]" * 100000)
            return
        with contextlib.suppress(OSError):
            for _ in range(200):
                self.wfile.write(b" ")
                self.wfile.flush()
                time.sleep(0.3)

    def log_message(self, *args: object) -> None:
        pass


def test_a_peer_answering_nested_json_or_trickling_is_one_row_and_asked_again() -> None:
    """The row says why, in one line, and its thread lives on: the peer is asked again
    and its row comes back once it answers well."""
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Hostile)
    httpd.daemon_threads = True
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{httpd.server_address[1]}"
    watch = PeerWatch([f"{base}/nested", f"{base}/slow"], interval=0.2, timeout=1.0).start()
    try:

        def said() -> list[dict]:
            rows = watch.latest()
            return rows if all(r["error"] != "not asked yet" for r in rows) else []

        nested, slow = wait_for(said, 30, lambda: f"both asked: {watch.latest()}", 0.1)
        assert nested["error"] == "answered JSON nested deeper than 64 levels", nested
        assert slow["error"] == "answered too slowly (over 3 s)", slow
        _Hostile.fixed = True
        wait_for(lambda: watch.latest()[0]["hostname"] == "mended", 30, "asked again", 0.1)
    finally:
        watch.stop()
        _Hostile.fixed = False
        httpd.shutdown()
        httpd.server_close()
