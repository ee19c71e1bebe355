"""The web page's server: routes, the shared feed, bounds, and malformed requests (4xx)."""

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
from pathlib import Path

import jsonschema
import pytest

from gpuwarden.base.errors import UserError
from gpuwarden.base.units import LOOPBACK, parse_listen
from gpuwarden.leases.dir import open_dir
from gpuwarden.leases.waitline import join
from gpuwarden.placement.request import Request
from gpuwarden.web.server import Feed, WebServer, serve
from repo import SRC
from schemas import WEB_STATE
from waiting import wait_for


@pytest.fixture
def web(sim) -> Iterator[WebServer]:
    sim("server-8xa100")
    server = serve("127.0.0.1:0", feed=Feed(interval=0.2), max_clients=4, timeout=5)
    yield server
    server.close()


def get(server: WebServer, path: str, method: str = "GET", host: str | None = None):
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
    try:
        headers = {} if host is None else {"Host": host}
        conn.request(method, path, headers=headers)
        response = conn.getresponse()
        return response.status, dict(response.getheaders()), response.read()
    finally:
        conn.close()


def raw(server: WebServer, data: bytes) -> bytes:
    """What the server answers to bytes no well-behaved client sends."""
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as s:
        chunks = []
        try:
            s.sendall(data)
            s.shutdown(socket.SHUT_WR)
        except OSError:  # the server answered and closed before reading it all
            pass
        while True:
            try:
                chunk = s.recv(65536)
            except ConnectionResetError:
                break
            if not chunk:
                break
            chunks.append(chunk)
    return b"".join(chunks)


def test_state_is_valid_json_with_every_gpu(web, cli):
    status, headers, body = get(web, "/api/v1/state")
    assert status == 200 and headers["Content-Type"] == "application/json"
    assert headers["Cache-Control"] == "no-store"
    doc = json.loads(body)
    jsonschema.validate(doc, WEB_STATE)
    assert len(doc["gpus"]) == 8
    reference = json.loads(cli("status", "--json").stdout)
    assert [g["memory_used"] for g in doc["gpus"]] == [g["memory_used"] for g in reference["gpus"]]


def test_page_assets_and_schema_are_served_with_a_strict_policy(web):
    status, headers, body = get(web, "/")
    assert status == 200 and b'<script src="/app.js"' in body
    assert "default-src 'self'" in headers["Content-Security-Policy"]
    assert headers["X-Content-Type-Options"] == "nosniff"
    for path in ("/app.js", "/style.css"):
        assert get(web, path)[0] == 200
    status, _, body = get(web, "/api/v1/schema")
    assert status == 200 and json.loads(body) == WEB_STATE
    status, headers, body = get(web, "/", method="HEAD")
    assert status == 200 and body == b"" and int(headers["Content-Length"]) > 0


def test_the_page_script_never_parses_data_as_markup():
    script = (Path(__file__).parent.parent / "src/gpuwarden/web/static/app.js").read_text()
    for sink in ("innerHTML", "outerHTML", "insertAdjacentHTML", "document.write", "eval("):
        assert sink not in script


@pytest.mark.parametrize(
    ("request_bytes", "status"),
    [
        (b"GET /nope HTTP/1.1\r\nHost: localhost\r\n\r\n", b"404"),
        (b"POST /api/v1/state HTTP/1.1\r\nHost: localhost\r\nContent-Length: 0\r\n\r\n", b"405"),
        (b"DELETE / HTTP/1.1\r\nHost: localhost\r\n\r\n", b"405"),
        (b"BREW /pot HTTP/1.1\r\nHost: localhost\r\n\r\n", b"405"),
        (b"GARBAGE\r\n\r\n", b"400"),
        (b"GET / HTTP/9.9\r\nHost: localhost\r\n\r\n", b"505"),  # not malformed: unsupported
        # exactly what the server reads of an overlong line: nothing left unread, so
        # closing sends no reset that could overtake the answer
        (b"GET /" + b"a" * (65537 - 5), b"414"),
        (b"GET / HTTP/1.1\r\nHost: evil.example\r\n\r\n", b"400"),  # DNS rebinding
        (b"\x16\x03\x01\x00\xa5\x01\x00\x00\xa1\x03\x03", b"400"),  # TLS to a plain port
    ],
)
def test_malformed_or_unwanted_requests_get_a_clear_answer(web, request_bytes, status):
    answer = raw(web, request_bytes)
    assert answer.split(b" ", 2)[1] == status, answer[:200]
    assert b"Traceback" not in answer


def test_loopback_host_names_are_accepted(web):
    for host in ("localhost", f"127.0.0.1:{web.port}", "[::1]:80", "localhost:1"):
        assert get(web, "/api/v1/state", host=host)[0] == 200, host
    for host in ("localhost.evil.example", "127.0.0.1.nip.io", "[::2]"):
        assert get(web, "/api/v1/state", host=host)[0] == 400, host
    # no Host at all (an HTTP/1.0 script): no browser sends that, so no rebinding
    assert raw(web, b"GET /api/v1/state HTTP/1.0\r\n\r\n").startswith(b"HTTP/1.1 200 ")


def test_events_stream_sends_each_new_document(web):
    conn = http.client.HTTPConnection("127.0.0.1", web.port, timeout=10)
    conn.request("GET", "/api/v1/events")
    response = conn.getresponse()
    assert response.status == 200
    assert response.getheader("Content-Type") == "text/event-stream"
    seen = []
    while len(seen) < 3:
        line = response.fp.readline()
        assert line, "the stream ended"
        if line.startswith(b"data: "):
            seen.append(json.loads(line[6:]))
    conn.close()
    assert [len(d["gpus"]) for d in seen] == [8, 8, 8]
    assert seen[0]["now"] < seen[1]["now"] < seen[2]["now"]


def test_every_client_shares_one_reading(web):
    before = web.feed.samples
    started = time.monotonic()
    for _ in range(30):
        assert get(web, "/api/v1/state")[0] == 200
    elapsed = time.monotonic() - started
    # one reading per interval (0.2 s), however many requests came meanwhile
    assert web.feed.samples - before <= elapsed / 0.2 + 2


def test_connections_beyond_the_limit_are_refused_not_queued(web):
    streams = []
    try:
        for _ in range(4):  # max_clients=4: fill every slot with a live stream
            conn = http.client.HTTPConnection("127.0.0.1", web.port, timeout=10)
            conn.request("GET", "/api/v1/events")
            response = conn.getresponse()  # the stream's socket: kept open while referenced
            assert response.status == 200
            streams.append(response)
        # the refusal comes at once, before any request is read (so send none)
        with socket.create_connection(("127.0.0.1", web.port), timeout=10) as extra:
            answer = extra.makefile("rb").read()
        assert answer.startswith(b"HTTP/1.1 503")
    finally:
        for response in streams:
            response.close()
    # slots come back once the pages close
    wait_for(lambda: get(web, "/api/v1/state")[0] == 200, 10, "a 200 again")


def test_a_page_closed_frees_its_place_for_the_next_connection(web):
    # Every place held by an open page: the next connection is refused; once one
    # page closes, its place serves the next connection (waited for with a bound).
    streams = []
    try:
        for _ in range(4):
            conn = http.client.HTTPConnection("127.0.0.1", web.port, timeout=10)
            conn.request("GET", "/api/v1/events")
            response = conn.getresponse()  # the stream's socket: kept open while referenced
            assert response.status == 200
            streams.append(response)
        assert get(web, "/api/v1/state")[0] == 503
        streams.pop().close()
        wait_for(lambda: get(web, "/api/v1/state")[0] == 200, 10, "a 200 again")
        assert web.httpd.connections <= 4
    finally:
        for response in streams:
            response.close()


def test_an_events_stream_answers_head_and_is_kept_alive_when_quiet(sim, monkeypatch):
    import gpuwarden.web.server as web_server

    sim("server-8xa100")
    monkeypatch.setattr(web_server.PageEvents, "keepalive", 0.2)
    server = serve("127.0.0.1:0", feed=Feed(interval=3600), max_clients=4, timeout=5)
    try:
        status, headers, body = get(server, "/api/v1/events", method="HEAD")
        assert status == 200 and body == b"" and headers["Content-Type"] == "text/event-stream"
        with socket.create_connection(("127.0.0.1", server.port), timeout=10) as s:
            s.sendall(b"GET /api/v1/events HTTP/1.1\r\nHost: localhost\r\n\r\n")
            reader = s.makefile("rb")
            seen = [reader.readline() for _ in range(20)]  # a socket timeout fails it
        assert seen[0].startswith(b"HTTP/1.1 200")
        assert sum(line.startswith(b"data: {") for line in seen) == 1  # one document
        assert b": keep-alive\n" in seen  # then, quiet, the pings
    finally:
        server.close()


def test_listen_addresses():
    def web(text: str) -> tuple[str, int]:
        return parse_listen(text, any_host=LOOPBACK, any_port=True)  # as the web page reads it

    assert web("9500") == ("127.0.0.1", 9500)
    assert web(":9500") == ("127.0.0.1", 9500)
    assert web("0.0.0.0:80") == ("0.0.0.0", 80)
    assert web("[::1]:80") == ("::1", 80)
    for bad in ("", "host:", "host:http", "1:99999"):
        with pytest.raises(UserError, match="invalid listen address"):
            web(bad)


def test_a_failed_read_keeps_the_page_up():
    calls = []

    def broken():
        calls.append(1)
        raise RuntimeError("NVML exploded")

    doc = Feed(read=broken).document()
    assert doc["gpus"] == [] and "NVML exploded" in doc["error"]
    jsonschema.validate(doc, WEB_STATE)


def test_cli_once_prints_the_document(cli, sim):
    sim("server-8xa100")
    result = cli("web", "--once")
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)
    jsonschema.validate(doc, WEB_STATE)
    assert len(doc["gpus"]) == 8 and doc["show_commands"] is False
    shown = json.loads(cli("web", "--once", "--show-commands").stdout)
    assert shown["show_commands"] is True
    assert any(p["command"] for g in shown["gpus"] for p in g["processes"])


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--listen", "nowhere"], "invalid listen address 'nowhere'"),
        (["--interval", "0"], "web.interval must be between"),
        (["--interval", "soon"], "invalid interval 'soon'"),
    ],
)
def test_cli_bad_settings_are_one_line(cli, sim, args, message):
    sim("server-8xa100")
    result = cli("web", *args)
    assert result.returncode != 0
    assert message in result.stderr and "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_cli_port_in_use_is_one_line(cli, sim):
    sim("server-8xa100")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = cli("web", "--no-watch", "--listen", f"127.0.0.1:{port}", timeout=30)
    assert result.returncode != 0
    assert "cannot listen on 127.0.0.1" in result.stderr and "Traceback" not in result.stderr


def test_kept_alive_requests_are_not_held_back_by_delayed_acks(web):
    """Headers and body go out in two writes; without TCP_NODELAY the second waits for
    the client's delayed ACK, ~40 ms a request on Linux."""
    conn = http.client.HTTPConnection("127.0.0.1", web.port, timeout=10)
    times = []
    try:
        for _ in range(15):
            started = time.perf_counter()
            conn.request("GET", "/api/v1/state")
            response = conn.getresponse()
            response.read()
            times.append(time.perf_counter() - started)
            assert response.status == 200
    finally:
        conn.close()
    assert sorted(times)[len(times) // 2] < 0.025


def test_cli_serves_until_terminated(sim):
    """`gpuwarden web --listen 127.0.0.1:0` as a user starts it: it says where it serves,
    answers, and stops cleanly on SIGTERM."""
    sim("server-8xa100")
    env = dict(os.environ, PYTHONPATH=str(SRC))
    proc = subprocess.Popen(
        [sys.executable, "-m", "gpuwarden", "web", "--listen", "127.0.0.1:0"],
        env=env,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        line = proc.stderr.readline()  # blocks until the server says where it is
        assert " INFO gpuwarden.web: serving http://127.0.0.1:" in line, line
        port = int(line.split("127.0.0.1:")[1].split("/")[0])
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        conn.request("GET", "/api/v1/state")
        doc = json.loads(conn.getresponse().read())
        conn.close()
        assert len(doc["gpus"]) == 8 and doc["watch"]["running"] is True
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
        assert "Traceback" not in proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_waiting_clients_are_listed(sim):
    sim("server-8xa100")
    ticket = join(open_dir(), Request(count=2), need=2)
    try:
        [waiter] = Feed().document()["waitline"]
        assert waiter["wants"] == "2 GPUs" and waiter["waited"] >= 0
        assert waiter["pid"] == os.getpid()
    finally:
        ticket.leave()
    assert Feed().document()["waitline"] == []
