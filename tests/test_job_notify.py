"""Per-job notifications (`submit --notify`) posted to the user's own webhook, as the user."""

from __future__ import annotations

import os
import subprocess
import threading
from collections.abc import Iterator
from http.server import HTTPServer
from pathlib import Path

import pytest

from gpuwarden.base.errors import UserError
from gpuwarden.service import jobnotify
from hermetic import hermetic
from repo import SRC
from servicetools import USER_PY, Server, become, serving
from users import make_user
from waiting import wait_for
from webhooks import Hook


def test_notify_names_read_as_slurms_mail_types() -> None:
    assert jobnotify.events_of("begin,END,Timeout") == ("BEGIN", "END", "TIME_LIMIT")
    assert jobnotify.events_of("all") == jobnotify.EVENTS and jobnotify.events_of("none") == ()
    with pytest.raises(UserError, match="invalid --notify 'often'"):
        jobnotify.events_of("begin,often")
    assert jobnotify.matched(["END", "FAIL"], "FAILED") == ["END", "FAIL"]
    assert jobnotify.matched(["FAIL", "TIME_LIMIT"], "TIMEOUT") == ["TIME_LIMIT"]


@pytest.fixture
def server(tmp_path: Path, open_dir: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Server]:
    yield from serving(tmp_path, open_dir, monkeypatch)


def test_a_jobs_events_go_to_its_owners_webhook_as_its_owner(server: Server) -> None:
    alice = make_user("alice", ("lab",))
    hook = HTTPServer(("127.0.0.1", 0), Hook)
    threading.Thread(target=hook.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{hook.server_address[1]}/gw"
    Hook.got.clear()
    try:
        env = {
            "PYTHONPATH": str(SRC),
            **hermetic(),
            "PATH": "/usr/bin:/bin",
            "GPUWARDEN_SOCKET": server.socket,
            "GPUWARDEN_SUBMIT_WEBHOOK": url,
        }
        argv = ["submit", "--notify", "begin,end,fail", "--", "sh", "-c", "exit 3"]
        done = subprocess.run(
            [USER_PY, "-m", "gpuwarden", *argv],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
            preexec_fn=become(alice),
            cwd=str(server.work),
        )
        assert done.returncode == 0, done.stderr
        job = int(done.stdout)
        wait_for(lambda: len(Hook.got) >= 2, 30, lambda: f"both events posted: {Hook.got}")
        assert [g["events"] for g in Hook.got] == [["BEGIN"], ["END", "FAIL"]], Hook.got
        assert {g["job"] for g in Hook.got} == {job}
        assert Hook.got[1]["state"] == "FAILED" and Hook.got[1]["exit_code"] == 3
        assert {g["_uid"] for g in Hook.got} == {alice.uid}  # posted as alice, not root
        unset = dict(env)
        del unset["GPUWARDEN_SUBMIT_WEBHOOK"]
        refused = subprocess.run(
            [USER_PY, "-m", "gpuwarden", *argv],
            env=unset,
            capture_output=True,
            text=True,
            timeout=60,
            preexec_fn=become(alice),
            cwd=str(server.work),
        )
        assert refused.returncode == 2 and "[submit] table" in refused.stderr
        assert refused.stderr.count("\n") == 1
    finally:
        hook.shutdown()
        os.environ.pop("GPUWARDEN_SUBMIT_WEBHOOK", None)
