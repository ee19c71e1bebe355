"""The queue service watches the GPUs' health itself: with no exporter running, a fatal
XID drains the GPU, the service's log says so, `service.webhook` gets the event, and
no job is placed on that GPU."""

from __future__ import annotations

import http.server
import json
import signal
import threading
from pathlib import Path
from typing import Any

import pytest

from gpuwarden.health.drain import list_drains
from servicetools import Server, submit
from users import make_user
from waiting import wait_for


def test_a_fatal_xid_is_drained_logged_and_posted_without_an_exporter(
    tmp_path: Path, open_dir: Path, monkeypatch: pytest.MonkeyPatch, cli: Any
) -> None:
    got: list[dict[str, Any]] = []

    class Hook(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            got.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
            self.send_response(204)
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    web = http.server.HTTPServer(("127.0.0.1", 0), Hook)
    threading.Thread(target=web.serve_forever, daemon=True).start()
    monkeypatch.setenv("GPUWARDEN_LEASE_DIR", str(tmp_path / "service-leases"))
    monkeypatch.setenv("GPUWARDEN_SERVICE_WEBHOOK", f"http://127.0.0.1:{web.server_port}/hook")
    monkeypatch.setenv("GPUWARDEN_HEALTH_POLL_SECONDS", "1")
    alice = make_user("alice", ("lab",))
    srv = Server(tmp_path, open_dir / "work", ())
    srv.start()
    try:
        srv.wait_log("health watch: policy drain")
        injected = cli("sim", "inject", "xid", "--gpu", "2", "79", env={"GPUWARDEN_SIM": srv.spec})
        assert injected.returncode == 0, injected.stderr
        srv.wait_log("health watch drained GPU 2 (")
        assert "XID 79" in srv.log_tail(), srv.log_tail()
        drained = list_drains()
        assert len(drained) == 1, drained
        wait_for(lambda: any(e.get("drained") for e in got), 30, "the drain posted")
        event = next(e for e in got if e.get("drained"))
        assert (event["gpu_index"], event["level"]) == (2, "fatal")
        # Nothing is placed on the drained GPU: four GPUs asked for can never start.
        job = submit(srv, alice, ["true"], request={"count": 3})
        row = srv.wait_state(job, ("COMPLETED",))
        assert row["state"] == "COMPLETED"
        assert 2 not in (row.get("gpus") or [])
    finally:
        srv.kill(signal.SIGTERM)
        srv.kill_jobs()
        web.shutdown()
