"""`gpuwarden web --peers URL...`: other hosts' pages on this one, from their own JSON
API. The peer is a real `gpuwarden web` process on its own simulated machine; a peer
that does not answer is a row saying so, and the page's document stays valid."""

from __future__ import annotations

import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator

import jsonschema
import pytest

from conftest import SRC
from gpuwarden.errors import UserError
from gpuwarden.web.peers import check_url, summary
from gpuwarden.web.server import Feed, WebServer, serve
from test_web_server import SCHEMA


@pytest.fixture
def peer(tmp_path) -> Iterator[str]:
    """`gpuwarden web` of another machine (a workstation with dave on GPU 1): its URL."""
    env = dict(
        os.environ,
        PYTHONPATH=str(SRC),
        GPUWARDEN_SIM="workstation-3x3090",
        GPUWARDEN_SIM_STATE=str(tmp_path / "peer-sim"),
        GPUWARDEN_LEASE_DIR=str(tmp_path / "peer-leases"),
        GPUWARDEN_STATE_DIR=str(tmp_path / "peer-state"),
    )
    proc = subprocess.Popen(
        [sys.executable, "-m", "gpuwarden", "web", "--listen", "127.0.0.1:0", "--no-watch"],
        env=env,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stderr is not None
        line = proc.stderr.readline()  # blocks until the server says where it is
        assert "serving http://127.0.0.1:" in line, line
        yield line.split("serving ", 1)[1].split()[0]
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(30)


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])  # closed again: nothing listens there


def _state(server: WebServer) -> dict:
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
    try:
        conn.request("GET", "/api/v1/state")
        return json.loads(conn.getresponse().read())
    finally:
        conn.close()


def test_a_peer_page_shows_on_this_one_and_a_silent_peer_is_one_row(sim, peer) -> None:
    sim("server-8xa100")
    peers = [check_url(peer), check_url(f"http://127.0.0.1:{_closed_port()}/")]  # as the CLI
    server = serve("127.0.0.1:0", feed=Feed(interval=0.2, peers=peers), max_clients=4)
    try:
        end = time.monotonic() + 20
        while True:
            doc = _state(server)
            if doc["peers"][0]["gpus"] and doc["peers"][1]["error"] != "not asked yet":
                break
            assert time.monotonic() < end, doc["peers"]
            time.sleep(0.1)
    finally:
        server.close()
    jsonschema.validate(doc, SCHEMA)
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
    jsonschema.validate({"peers": [odd]}, {"properties": {"peers": SCHEMA["properties"]["peers"]}})
    assert odd["gpus"][0]["index"] is None and odd["gpus"][0]["utilization"] is None
    assert len(odd["hostname"]) == 64 and odd["gpus"][0]["users"] == ["3"]
    assert summary("http://x", [1, 2])["error"].startswith("answered with something")
