"""Notifications never hold the service: a user's dead webhook neither stops a stop nor
delays anyone else's posts (service.notify, service.outbox)."""

from __future__ import annotations

import json
import os
import signal
import socket
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path
from typing import Any

import pytest

from gpuwarden.service.outbox import SERVICE, Outbox
from servicetools import Server, serving, submit
from users import make_user
from waiting import wait_for


class Silent:
    """A webhook that accepts connections and never answers (nor reads)."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.held: list[socket.socket] = []
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}/hook"
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.held.append(conn)

    def close(self) -> None:
        self.sock.close()
        for conn in self.held:
            conn.close()


class Answering(BaseHTTPRequestHandler):
    got: list[dict[str, Any]]

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.server.got.append(body)  # type: ignore[attr-defined]
        self.send_response(204)
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def hook() -> Iterator[HTTPServer]:
    """A webhook that answers at once; what it got in `.got`."""
    httpd = HTTPServer(("127.0.0.1", 0), Answering)
    httpd.got = []  # type: ignore[attr-defined]
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield httpd
    httpd.shutdown()
    httpd.server_close()


def _url(httpd: HTTPServer) -> str:
    return f"http://127.0.0.1:{httpd.server_address[1]}/hook"


def _pending_ends(srv: Server, who: Any, url: str, tasks: int) -> int:
    """`tasks` held tasks with `--notify end` to `url`, cancelled: that many END posts."""
    array = submit(
        srv, who, ["true"], array=f"0-{tasks - 1}", hold=True, notify=["END"], notify_url=url
    )
    reply = srv.call(who, "cancel", jobs=[array])
    assert reply.get("ok"), reply
    return array


def test_sigterm_stops_the_service_in_seconds_with_a_thousand_posts_waiting(
    tmp_path: Path, open_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    srv_iter = serving(tmp_path, open_dir, monkeypatch)
    srv = next(srv_iter)
    dead = Silent()
    try:
        alice = make_user("alice", ("lab",))
        _pending_ends(srv, alice, dead.url, 1000)
        wait_for(lambda: dead.held, 30, "the first post reached the dead webhook")
        assert srv.proc is not None
        began = time.monotonic()
        srv.proc.send_signal(signal.SIGTERM)
        srv.proc.wait(60)
        took = time.monotonic() - began
        assert took < 10, f"the service took {took:.1f} s to stop\n{srv.log_tail()}"
        assert "notifications not sent" in srv.log_tail(), srv.log_tail()
        # the next service starts at once: nothing of the last one holds its locks
        srv.start()
        assert "another gpuwarden serve" not in srv.log_tail()
        # and one killed outright takes its helper with it
        _pending_ends(srv, alice, dead.url, 100)
        srv.kill(signal.SIGKILL)
        srv.start()
        assert srv.call(None, "queue").get("ok"), srv.log_tail()
    finally:
        dead.close()
        for _ in srv_iter:
            pass


@pytest.fixture
def admin_hook(hook: HTTPServer, monkeypatch: pytest.MonkeyPatch) -> HTTPServer:
    monkeypatch.setenv("GPUWARDEN_SERVICE_WEBHOOK", _url(hook))
    return hook


def test_one_users_dead_webhook_delays_only_their_own_posts(
    admin_hook: HTTPServer, tmp_path: Path, open_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    own = HTTPServer(("127.0.0.1", 0), Answering)
    own.got = []  # type: ignore[attr-defined]
    threading.Thread(target=own.serve_forever, daemon=True).start()
    dead = Silent()
    srv_iter = serving(tmp_path, open_dir, monkeypatch)
    srv = next(srv_iter)
    try:
        alice, bob = make_user("alice", ("lab",)), make_user("bob")
        _pending_ends(srv, alice, dead.url, 300)
        wait_for(lambda: dead.held, 30, "alice's first post reached her dead webhook")
        job = submit(srv, bob, ["true"], notify=["END"], notify_url=_url(own))
        srv.wait_state(job, ("COMPLETED",))
        got = own.got  # type: ignore[attr-defined]
        admin = admin_hook.got  # type: ignore[attr-defined]
        wait_for(lambda: any(g["job"] == job for g in got), 30, f"bob's post: {srv.log_tail()}")
        wait_for(
            lambda: any(g.get("job") == job for g in admin), 30, f"the admin's: {srv.log_tail()}"
        )
        assert "backed up" not in srv.log.read_text()  # alice's 300 wait in her own queue
    finally:
        dead.close()
        for _ in srv_iter:
            pass
        own.shutdown()
        own.server_close()


def test_a_full_queue_drops_only_its_senders_posts_and_says_so_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    release = threading.Event()
    sent: list[tuple[object, int]] = []

    sending = threading.Event()

    def send(key: object, event: dict[str, Any]) -> None:
        if key == ("owner", 1):
            sending.set()
            release.wait(30)
        sent.append((key, event["n"]))

    box = Outbox(send, per_key=5, at_once=1)
    kept = [box.put(("owner", 1), {"n": n}) for n in range(20)]
    assert kept.count(True) in (5, 6)  # the first may already be on its way out
    assert sending.wait(10)  # owner 1's first post holds the one owner slot
    box.put(("owner", 2), {"n": 0})  # so this one waits for it...
    box.put(SERVICE, {"n": 0})  # ...the service's own never does
    wait_for(lambda: (SERVICE, 0) in sent, 10, "the admin's post")
    assert (("owner", 2), 0) not in sent
    release.set()
    wait_for(lambda: box.pending() == 0 and ("owner", 2) in {k for k, _ in sent}, 10, "all sent")
    time.sleep(0.2)
    lines = [r.getMessage() for r in caplog.records]
    assert sum(line.startswith("notifications for") for line in lines) == 1, lines
    dropped = [line for line in lines if line.startswith("dropped")]
    assert len(dropped) == 1 and dropped[0].startswith(f"dropped {kept.count(False)} "), lines


def test_the_helper_holds_none_of_the_services_descriptors(server: Server) -> None:
    """The helper's open descriptors: its standard ones and its pipe, no lock."""
    assert server.proc is not None
    helpers = [
        int(p)
        for p in os.listdir("/proc")
        if p.isdigit() and _ppid(int(p)) == server.proc.pid and _is_python(int(p))
    ]
    assert helpers, "the notification helper"
    for pid in helpers:
        names = [os.readlink(f"/proc/{pid}/fd/{fd}") for fd in os.listdir(f"/proc/{pid}/fd")]
        assert not [n for n in names if n.endswith((".lock", ".db", ".sock"))], names


def _ppid(pid: int) -> int:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return -1


def _is_python(pid: int) -> bool:
    try:
        return "gpuwarden" in Path(f"/proc/{pid}/cmdline").read_text()
    except OSError:
        return False
