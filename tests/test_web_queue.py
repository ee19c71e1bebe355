"""The page's queue and fair-share sections: the pure section builder on hand-made
answers (well-formed, malformed, hostile), and `ask()` and the feed against fake
services that answer garbage, nothing, or a byte at a time. The real service on
the page, in a browser, is in test_web_browser.py."""

from __future__ import annotations

import contextlib
import http.client
import json
import math
import os
import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from gpuwarden.machine.inventory import Gpu, Snapshot
from gpuwarden.web import usage
from gpuwarden.web.model import build
from gpuwarden.web.queue import JOBS_SHOWN, NO_QUEUE, NOT_ANSWERING, QueuePoller, ask, section
from gpuwarden.web.server import Feed, serve
from schemas import WEB_STATE
from waiting import wait_for

NOW = 1_700_000_000.0
FOUR = Snapshot(NOW, "lab1", gpus=tuple(Gpu(index=i, uuid=f"GPU-{i:04d}") for i in range(4)))


def valid(doc: dict) -> dict:
    again = json.loads(json.dumps(doc, allow_nan=False))
    jsonschema.validate(again, WEB_STATE)
    return again


def row(job_id: int, user: str, state: str, **kw: Any) -> dict[str, Any]:
    out = {
        "id": job_id,
        "user": user,
        "state": state,
        "count": 1,
        "gpus": [],
        "mem": None,
        "reason": None,
        "submitted": NOW - 100,
        "started": None,
        "ended": None,
        "time_limit": None,
        "held": False,
        "after": [],
        "exit_code": None,
        "signal": None,
        "error": None,
        "priority": None,
        "estimated_start": None,
        "command": None,
    }
    out.update(kw)
    return out


def answered(jobs: Any, users: Any = (), **hello: Any) -> dict[str, Any]:
    return {
        "state": "answered",
        "hello": {"ok": True, "v": 1, "user": "gw-web", "uid": 990, "admin": False, **hello},
        "queue": {"ok": True, "v": 1, "jobs": jobs},
        "share": {"ok": True, "v": 1, "users": list(users)},
    }


JOBS = [
    row(
        1,
        "gw-alice",
        "RUNNING",
        gpus=["GPU-0000", "GPU-0001"],
        started=NOW - 60,
        time_limit=3600.0,
        priority=9.0,
    ),
    row(
        2,
        "gw-bob",
        "PENDING",
        reason="Resources",
        priority=500.0,
        estimated_start=NOW + 30,
        account="nlp",
    ),
    row(3, "gw-alice", "PENDING", reason="Priority", priority=100.0, command=["python", "a b"]),
    row(4, "gw-bob", "STARTING", gpus=["GPU-0002"], started=NOW - 1),
]
SHARES = [
    {"user": "gw-alice", "usage": 7200.0, "share": 1.0, "factor": 0.25},
    {"user": "gw-bob", "usage": 0.0, "share": 2.0, "factor": 1.0},
    {"user": "gw-carol", "usage": 360.0, "share": 1.0, "factor": 0.9},
]


def test_running_and_waiting_jobs_with_reason_priority_and_times():
    doc = valid(build(FOUR, now=NOW, service=answered(JOBS, SHARES)))
    queue = doc["queue"]
    assert queue["service"] is True and queue["state"] == "running"
    assert queue["user"] == "gw-web" and queue["admin"] is False and queue["error"] is None
    assert [j["id"] for j in queue["running"]] == [1, 4]  # by start
    assert [j["id"] for j in queue["waiting"]] == [2, 3]  # by priority, highest first
    first, starting = queue["running"]
    assert first["gpus"] == [0, 1] and first["uuids"] == ["GPU-0000", "GPU-0001"]
    assert first["elapsed"] == pytest.approx(60)
    assert first["waited"] == pytest.approx(40)  # submitted 100 s ago, started 60 s ago
    assert starting["state"] == "STARTING"
    bob = queue["waiting"][0]
    assert bob["reason"] == "Resources" and bob["priority"] == 500.0
    assert bob["waited"] == pytest.approx(100) and bob["elapsed"] is None
    assert bob["estimated_start"] == NOW + 30
    assert bob["account"] == "nlp" and first["account"] is None  # --account, where named


def test_an_array_task_is_named_as_the_cli_names_it():
    task = row(117, "gw-alice", "PENDING", array_job=117, array_task=0)
    doc = valid(build(FOUR, now=NOW, service=answered([task, row(118, "gw-bob", "PENDING")])))
    assert [j["name"] for j in doc["queue"]["waiting"]] == ["117_0", "118"]


def test_bookings_are_listed_by_start_and_malformed_ones_left_out():
    answer = answered(JOBS, SHARES)
    answer["queue"]["bookings"] = [
        {"id": 3, "count": 2, "start": NOW + 7200, "end": NOW + 9000, "user": None,
         "group": "course", "reason": "lab", "by": "root"},
        {"id": 2, "count": 1, "start": NOW - 60, "end": NOW + 600, "user": "gw-alice",
         "group": None, "reason": "deadline", "by": "root"},
        {"id": 4, "count": "many", "start": NOW, "end": NOW + 1},
        {"id": 5, "count": 1, "start": NOW - 900, "end": NOW - 1, "user": "gw-bob"},
    ]  # fmt: skip
    booked = valid(build(FOUR, now=NOW, service=answer))["queue"]["bookings"]
    assert [(b["id"], b["whom"], b["reason"]) for b in booked] == [
        (2, "gw-alice", "deadline"),
        (3, "@course", "lab"),
    ]
    assert "bookings" not in valid(build(FOUR, now=NOW, service=answered(JOBS)))["queue"]


def test_fair_share_beside_gpus_in_use_and_users_known_only_to_the_service():
    doc = valid(build(FOUR, now=NOW, service=answered(JOBS, SHARES)))
    users = {u["user"]: u for u in doc["users"]}
    assert users["gw-alice"]["usage"] == 7200.0 and users["gw-alice"]["factor"] == 0.25
    assert users["gw-bob"]["share"] == 2.0
    assert (users["gw-alice"]["jobs_running"], users["gw-alice"]["jobs_waiting"]) == (1, 1)
    assert (users["gw-bob"]["jobs_running"], users["gw-bob"]["jobs_waiting"]) == (1, 1)
    assert users["gw-carol"]["used_gpus"] == [] and users["gw-carol"]["jobs_running"] == 0
    # Without a service the figures are null, never zero (zero usage is a claim).
    alone = valid(build(Snapshot(NOW, "lab1"), now=NOW))
    assert alone["users"] == []


def test_commands_only_when_configured_and_only_what_the_service_gave():
    hidden = build(FOUR, now=NOW, service=answered(JOBS, SHARES))
    assert all(
        j["command"] is None for j in hidden["queue"]["waiting"] + hidden["queue"]["running"]
    )
    assert "python" not in json.dumps(hidden)
    shown = valid(
        build(Snapshot(NOW, "lab1"), now=NOW, show_commands=True, service=answered(JOBS, SHARES))
    )
    by_id = {j["id"]: j for j in shown["queue"]["waiting"]}
    assert by_id[3]["command"] == "python 'a b'"
    assert by_id[2]["command"] is None  # the service hid bob's command: nothing to show


def test_without_a_service_the_placeholder_stays():
    for answer in (None, {"state": "absent"}):
        queue = valid(build(Snapshot(NOW, "lab1"), now=NOW, service=answer))["queue"]
        assert queue["service"] is False and queue["state"] == NO_QUEUE
        assert queue["running"] == [] and queue["waiting"] == []


@pytest.mark.parametrize(
    "answer",
    [
        {"state": "failed", "error": "no answer within 0.5 s"},
        {"state": "answered"},
        {"state": "answered", "hello": [], "queue": {"ok": True, "jobs": []}},
        {**answered([]), "queue": {"ok": True, "jobs": {"1": "x"}}},
        {**answered([]), "queue": {"ok": False, "error": "x" * 5000}},
        {**answered([]), "queue": "RUNNING"},
        {**answered([]), "hello": {"ok": "yes"}},
        {"state": 7},
    ],
)
def test_a_malformed_answer_shows_the_service_as_not_answering(answer):
    queue = valid(build(Snapshot(NOW, "lab1"), now=NOW, service=answer))["queue"]
    assert queue["service"] is False and queue["state"] == NOT_ANSWERING
    assert queue["error"] and len(queue["error"]) <= 200
    assert queue["running"] == [] and queue["waiting"] == []


def test_malformed_rows_and_figures_cost_only_themselves():
    jobs = [
        "not a row",
        None,
        {"id": "1", "user": "x", "state": "PENDING"},
        {"id": True, "user": "x", "state": "PENDING"},
        {"id": 5, "user": None, "state": "PENDING"},
        {"id": 6, "user": "x", "state": ["RUNNING"]},
        row(7, "gw-eve", "PENDING", priority=math.nan, submitted="yesterday", gpus="0,1"),
        row(
            8,
            "gw-eve",
            "RUNNING",
            started=math.inf,
            gpus=["GPU-0000", 1, None, "GPU-9", True, "GPU-0003"],
        ),
        row(9, "<b>x</b>" * 100, "PENDING", reason={"r": 1}, command="rm -rf /"),
        row(10, "gw-eve", "COMPLETED"),  # not active: not listed
    ]
    shares = ["x", {"user": 3}, {"user": "gw-eve", "usage": "lots", "share": -1, "factor": None}]
    doc = valid(build(FOUR, now=NOW, show_commands=True, service=answered(jobs, shares)))
    queue = doc["queue"]
    assert queue["state"] == "running"
    assert [j["id"] for j in queue["waiting"]] == [7, 9]
    seven, nine = queue["waiting"]
    assert seven["priority"] is None and seven["submitted"] is None and seven["gpus"] == []
    assert nine["user"].endswith("…") and len(nine["user"]) <= 200 and nine["reason"] is None
    assert nine["command"] is None  # a string is not a command list: not shown
    [eight] = queue["running"]
    assert eight["gpus"] == [0, 3] and eight["uuids"] == ["GPU-0000", "GPU-9", "GPU-0003"]
    assert eight["started"] is None and eight["elapsed"] is None
    eve = next(u for u in doc["users"] if u["user"] == "gw-eve")
    assert eve["usage"] is None and eve["factor"] is None


def test_a_negative_share_from_the_service_is_left_out_not_published():
    # The schema says usage, share and factor are >= 0; the section must keep to it.
    shares = [{"user": "gw-eve", "usage": -5.0, "share": -1.0, "factor": -0.5}]
    doc = valid(build(Snapshot(NOW, "lab1"), now=NOW, service=answered([], shares)))
    eve = next(u for u in doc["users"] if u["user"] == "gw-eve")
    assert (eve["usage"], eve["share"], eve["factor"]) == (None, None, None)


def test_long_queues_are_capped_and_counted():
    jobs = [row(i, "gw-a", "PENDING", priority=float(i)) for i in range(1, JOBS_SHOWN + 51)]
    queue = valid(build(Snapshot(NOW, "lab1"), now=NOW, service=answered(jobs)))["queue"]
    assert len(queue["waiting"]) == JOBS_SHOWN and queue["hidden"] == 50
    assert queue["waiting"][0]["id"] == JOBS_SHOWN + 50  # the highest priorities are kept


def test_share_refused_keeps_the_queue():
    answer = {**answered(JOBS), "share": {"ok": False, "error": "share is for admins"}}
    queue, shares = section(answer, NOW)
    assert queue["service"] is True and len(queue["waiting"]) == 2
    assert shares == {} and "share refused: share is for admins" in queue["error"]


# --- against fake services on a real socket --------------------------------------------


class FakeService:
    """A Unix socket that answers each request line with `reply(request)`: bytes to
    send (None: say nothing, keep the connection open; b"": hang up)."""

    def __init__(self, path: str, reply: Callable[[dict], bytes | None], trickle: float = 0):
        self.path = path
        self.reply = reply
        self.trickle = trickle
        self.asked = 0
        self.connections = 0
        self.open: list[socket.socket] = []
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.listener.bind(path)
        self.listener.listen(16)
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        self.listener.settimeout(0.1)
        while not self.stop.is_set():
            try:
                conn, _ = self.listener.accept()
            except OSError:
                continue
            self.connections += 1
            self.open.append(conn)
            threading.Thread(target=self._client, args=(conn,), daemon=True).start()

    def _client(self, conn: socket.socket) -> None:
        with conn, conn.makefile("rb") as lines:
            for line in lines:
                self.asked += 1
                data = self.reply(json.loads(line))
                if data == b"":  # hang up
                    return
                if data is None:
                    self.stop.wait()
                    return
                try:
                    if self.trickle:
                        for i in range(len(data)):
                            conn.sendall(data[i : i + 1])
                            if self.stop.wait(self.trickle):
                                return
                    else:
                        conn.sendall(data)
                except OSError:
                    return

    def close(self) -> None:
        self.stop.set()
        self.listener.close()
        for conn in self.open:  # the service is gone: so are its connections
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
        self.thread.join(5)


def good(request: dict) -> bytes:
    replies = answered(JOBS, SHARES)
    if request["op"] == "report":  # the month's usage: the window asked is this month's
        assert request["since"] == usage.window(time.time())[0] < request["until"]
        rows = MONTH[request["by"]]
        return json.dumps({"v": 1, "ok": True, "rows": rows}).encode() + b"\n"
    return json.dumps({"v": 1, **replies[request["op"]]}).encode() + b"\n"


def month_row(name: str, hours: Any, jobs: Any = 1) -> dict[str, Any]:
    return {"period": "all", "name": name, "gpu_hours": hours, "jobs": jobs, "runs": jobs}


MONTH = {
    "user": [month_row("gw-bob", 2.5), month_row("gw-alice", 40.0, 7)],
    "account": [month_row("vision", 40.0, 7), month_row("-", 2.5)],
}


@pytest.fixture
def fake(tmp_path: Path) -> Iterator[Callable[..., FakeService]]:
    made: list[FakeService] = []

    def make(reply: Callable[[dict], bytes | None], trickle: float = 0) -> FakeService:
        made.append(FakeService(str(tmp_path / f"fake{len(made)}.sock"), reply, trickle))
        return made[-1]

    yield make
    for service in made:
        service.close()


def test_ask_gets_all_three_answers_from_a_service(fake):
    service = fake(good)
    answer = ask(service.path, 2.0)
    assert answer["state"] == "answered"
    assert answer["hello"]["user"] == "gw-web" and len(answer["queue"]["jobs"]) == 4
    queue = section(answer, NOW)[0]
    assert queue["state"] == "running"
    # and the month's usage, the most GPU-hours first
    assert [(r["name"], r["gpu_hours"], r["jobs"]) for r in queue["usage"]["users"]] == [
        ("gw-alice", 40.0, 7),
        ("gw-bob", 2.5, 1),
    ]
    assert [r["name"] for r in queue["usage"]["accounts"]] == ["vision", "-"]
    assert queue["usage"]["month"] == usage.window(time.time())[1]


def test_the_usage_panel_keeps_only_well_formed_rows_and_is_left_out_without_any():
    bad = [
        month_row("gw-eve", float("nan")),
        month_row("gw-eve", -1.0),
        month_row("gw-eve", 1.0, jobs=True),
        {"name": 5, "gpu_hours": 1.0, "jobs": 1},
        "garbage",
        month_row("gw-dan", 3.0),
    ]
    answer = answered(JOBS)
    answer["usage"] = {"month": "2023-11", "user": {"ok": True, "rows": bad}, "account": None}
    queue = valid(build(FOUR, now=NOW, service=answer))["queue"]
    assert queue["usage"] == {
        "month": "2023-11",
        "users": [{"name": "gw-dan", "gpu_hours": 3.0, "jobs": 1}],
        "accounts": [],
    }
    answer["usage"] = {"month": "2023-11", "user": {"ok": False, "error": "no"}}
    assert "usage" not in valid(build(FOUR, now=NOW, service=answer))["queue"]
    assert usage.window(NOW)[1] == time.strftime("%Y-%m", time.localtime(NOW))


def test_the_months_report_is_asked_once_a_minute_not_every_interval(fake, monkeypatch):
    service = fake(good)
    asked: list[str] = []
    poller = QueuePoller(service.path, 0.05)
    real = poller.asker._call

    def counting(op: str, deadline: float, **fields: Any) -> Any:
        asked.append(op)
        return real(op, deadline, **fields)

    monkeypatch.setattr(poller.asker, "_call", counting)
    for _ in range(5):
        assert "usage" in poller.asker.ask()
    assert asked.count("report") == 2 and asked.count("queue") == 5  # by user, by account
    poller.asker.usage_at -= usage.EVERY
    poller.asker.ask()
    assert asked.count("report") == 4
    poller.asker.close()


def test_ask_without_a_service(tmp_path):
    assert ask(str(tmp_path / "none.sock")) == {"state": "absent"}
    assert ask(str(tmp_path / "not-a-dir" / "x.sock"))["state"] == "absent"
    stale = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stale.bind(str(tmp_path / "stale.sock"))  # bound, nobody listening: refused
    stale.close()
    assert ask(str(tmp_path / "stale.sock")) == {"state": "absent"}


@pytest.mark.parametrize(
    "reply, trickle",
    [
        (lambda r: None, 0),  # silent
        (good, 0.05),  # a byte at a time: each byte in time, the whole far too late
        (lambda r: b"\xff\xfe not json\n", 0),
        (lambda r: b"[1, 2, 3]\n", 0),
        (lambda r: b'{"v": 99, "ok": true}\n', 0),
        (lambda r: b"x" * (2 << 20), 0),  # no newline, ever larger
        (lambda r: b"", 0),  # hangs up at once
    ],
    ids=["silent", "trickle", "garbage", "array", "version", "huge", "hangs-up"],
)
def test_a_bad_service_gives_a_failure_within_the_deadline(fake, reply, trickle):
    service = fake(reply, trickle)
    started = time.monotonic()
    answer = ask(service.path, 0.3)
    took = time.monotonic() - started
    assert answer["state"] in ("failed", "answered")
    queue = valid(build(Snapshot(NOW, "lab1"), now=NOW, service=answer))["queue"]
    assert queue["state"] == NOT_ANSWERING and queue["error"], answer
    assert took < 2.0  # the deadline (0.3 s) with generous slack for a loaded machine


def test_a_stuck_service_cannot_stop_the_page(fake, sim):
    """The page keeps updating its GPUs and says why the queue is missing."""
    sim("server-8xa100")
    service = fake(lambda r: None)
    feed = Feed(interval=0.2, service=service.path, service_timeout=0.3)
    server = serve("127.0.0.1:0", feed=feed, max_clients=4, timeout=5)
    try:
        seen = set()
        doc: dict = {}

        def three_readings() -> bool:
            nonlocal doc
            conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
            conn.request("GET", "/api/v1/state")
            response = conn.getresponse()
            assert response.status == 200
            doc = valid(json.loads(response.read()))
            conn.close()
            seen.add(doc["now"])
            return len(seen) >= 3

        wait_for(
            three_readings,
            30,
            lambda: f"three readings of the page behind a stuck service (it stopped at {seen})",
        )
        assert len(doc["gpus"]) == 8
        assert doc["queue"]["state"] == NOT_ANSWERING
        assert "no answer within" in doc["queue"]["error"]
    finally:
        server.close()


def test_the_service_is_asked_once_per_interval_whatever_the_number_of_pages(fake, sim):
    sim("server-8xa100")
    service = fake(good)
    feed = Feed(interval=0.5, service=service.path)
    started = time.monotonic()
    server = serve("127.0.0.1:0", feed=feed, max_clients=16, timeout=5)
    try:
        for _ in range(40):
            conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
            conn.request("GET", "/api/v1/state")
            doc = json.loads(conn.getresponse().read())
            conn.close()
        rounds = (time.monotonic() - started) / 0.5 + 2
        assert doc["queue"]["service"] is True and len(doc["queue"]["waiting"]) == 2
        # hello once, then queue and share once per interval, however many requests came,
        # over one connection kept open.
        assert service.asked <= 1 + 2 * rounds
        assert service.connections == 1
    finally:
        server.close()


def test_a_service_restart_is_followed(fake, tmp_path):
    """A closed connection is reopened at the next question."""
    from gpuwarden.web.queue import Asker

    service = fake(good)
    asker = Asker(service.path, 2.0)
    try:
        assert asker.ask()["state"] == "answered"
        service.close()
        os.unlink(service.path)
        assert asker.ask()["state"] in ("failed", "absent")
        again = fake(good)
        os.rename(again.path, service.path)
        assert asker.ask()["state"] == "answered"
        assert again.connections == 1
    finally:
        asker.close()


def test_web_once_shows_the_service_named_by_socket(fake, sim, cli, tmp_path):
    sim("server-8xa100")
    service = fake(good)
    shown = cli("web", "--once", "--socket", service.path)
    assert shown.returncode == 0, shown.stderr
    doc = valid(json.loads(shown.stdout))
    assert doc["queue"]["service"] is True and [j["id"] for j in doc["queue"]["waiting"]] == [2, 3]
    assert doc["queue"]["usage"]["users"][0]["name"] == "gw-alice"
    alone = cli("web", "--once", "--socket", str(tmp_path / "nobody.sock"))
    assert json.loads(alone.stdout)["queue"]["state"] == NO_QUEUE


def test_a_service_lease_is_its_jobs_users_and_their_processes_are_reserved():
    """The service holds its jobs' leases as root; the page names the job's owner, and
    the owner's processes on that GPU are not flagged as unreserved use."""
    from gpuwarden.leases import LeaseInfo
    from gpuwarden.machine.inventory import GpuProcess

    def lease(user: str, job: str) -> LeaseInfo:
        return LeaseInfo(uuid="GPU-0000", user=user, pid=4000, command="", started=NOW, job=job)

    procs = (GpuProcess(pid=4242, used_memory=2**30, user="gw-alice"),)
    snap = Snapshot(NOW, "lab1", gpus=(Gpu(index=0, uuid="GPU-0000", processes=procs),))
    doc = valid(build(snap, leases=[lease("root", "1")], now=NOW, service=answered(JOBS)))
    [g0] = doc["gpus"]
    assert g0["leases"][0]["user"] == "gw-alice" and g0["processes"][0]["reserved"] is True
    users = {u["user"]: u for u in doc["users"]}
    assert users["gw-alice"]["leased_gpus"] == [0] and "root" not in users
    # Without the service's word, or from a lease file root does not own, nothing changes.
    alone = valid(build(snap, leases=[lease("root", "1")], now=NOW))
    assert alone["gpus"][0]["leases"][0]["user"] == "root"
    assert alone["gpus"][0]["processes"][0]["reserved"] is False
    forged = valid(build(snap, leases=[lease("gw-mallory", "1")], now=NOW, service=answered(JOBS)))
    assert forged["gpus"][0]["leases"][0]["user"] == "gw-mallory"
    assert forged["gpus"][0]["processes"][0]["reserved"] is False
