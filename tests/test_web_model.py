"""The web page's API document: a pure function of hand-built machine state, schema-checked."""

from __future__ import annotations

import json

import jsonschema
import pytest

from gpuwarden.health.drain import Drain
from gpuwarden.health.judgement import Symptom
from gpuwarden.jobs.allocation import describe_request
from gpuwarden.leases import LeaseInfo
from gpuwarden.leases.waitline import Waiter
from gpuwarden.machine.inventory import Gpu, GpuProcess, Snapshot
from gpuwarden.placement.request import Request
from gpuwarden.web.history import History
from gpuwarden.web.model import build, reserved
from gpuwarden.web.queue import NO_QUEUE
from gpuwarden.web.values import TEXT_LIMIT
from schemas import WEB_STATE

GIB = 2**30
NOW = 1_700_000_000.0


def valid(doc: dict) -> dict:
    """The document, after checking it against the published schema (and JSON round trip)."""
    jsonschema.Draft202012Validator.check_schema(WEB_STATE)
    again = json.loads(json.dumps(doc, allow_nan=False))
    jsonschema.validate(again, WEB_STATE)
    return again


def machine(*gpus: Gpu) -> Snapshot:
    return Snapshot(
        NOW - 0.1,
        "lab1",
        gpus=gpus,
        driver_version="550.54.15",
        cuda_driver_version=(12, 4),
        source="sim:test",
    )


def gpu(index: int, *procs: GpuProcess, used: int = 0) -> Gpu:
    return Gpu(
        index=index,
        uuid=f"GPU-{index:04d}",
        name="NVIDIA A100-SXM4-80GB",
        memory_total=80 * GIB,
        memory_used=used,
        memory_free=80 * GIB - used,
        utilization_gpu=50,
        temperature=60,
        processes=procs,
    )


def lease(index: int, user: str, pid: int, **kw: object) -> LeaseInfo:
    fields = {"command": "python train.py --secret-token=abc", "started": NOW - 90, "job": "j1"}
    fields.update(kw)
    return LeaseInfo(uuid=f"GPU-{index:04d}", user=user, pid=pid, **fields)  # type: ignore[arg-type]


def test_empty_machine_is_a_valid_document_with_the_queue_placeholder():
    doc = valid(build(Snapshot(NOW, "lab1", error="NVML not found"), now=NOW))
    assert doc["gpus"] == [] and doc["error"] == "NVML not found"
    assert doc["queue"] == {
        "service": False,
        "state": NO_QUEUE,
        "user": None,
        "admin": False,
        "error": None,
        "running": [],
        "waiting": [],
        "hidden": 0,
    }
    assert doc["watch"] == {"running": False, "listening": False}


def test_gpu_memory_processes_and_leases():
    p1 = GpuProcess(pid=10, used_memory=20 * GIB, user="ann", command="/usr/bin/python3 a.py")
    snap = machine(gpu(0, p1, used=25 * GIB), gpu(1))
    doc = valid(build(snap, leases=[lease(0, "ann", 9, expires=NOW + 600, mem=30 * GIB)], now=NOW))
    g0, g1 = doc["gpus"]
    assert (g0["memory_used"], g0["memory_total"]) == (25 * GIB, 80 * GIB)
    assert g0["memory_other"] == 5 * GIB  # used by nothing listed
    assert g0["processes"][0]["name"] == "python3"
    [held] = g0["leases"]
    assert held["job"] == "j1" and held["user"] == "ann"
    assert held["age"] == pytest.approx(90) and held["expires_in"] == pytest.approx(600)
    assert held["mem"] == 30 * GIB
    assert g1["leases"] == [] and g1["processes"] == []
    assert doc["driver_version"] == "550.54.15" and doc["cuda_driver_version"] == "12.4"


def test_commands_are_hidden_unless_asked_for():
    p1 = GpuProcess(pid=10, used_memory=GIB, user="ann", command="python a.py --password=x")
    snap = machine(gpu(0, p1, used=GIB))
    hidden = json.dumps(build(snap, leases=[lease(0, "ann", 10)], now=NOW))
    assert "password" not in hidden and "secret-token" not in hidden
    shown = valid(build(snap, leases=[lease(0, "ann", 10)], now=NOW, show_commands=True))
    assert shown["gpus"][0]["processes"][0]["command"] == "python a.py --password=x"
    assert "secret-token" in shown["gpus"][0]["leases"][0]["command"]


def test_unreserved_use_is_flagged_per_process_and_per_user():
    mine = GpuProcess(pid=11, used_memory=GIB, user="ann")
    child = GpuProcess(pid=12, used_memory=GIB, user=None)
    squatter = GpuProcess(pid=13, used_memory=2 * GIB, user="bob")
    elsewhere = GpuProcess(pid=14, used_memory=3 * GIB, user="bob")
    snap = machine(gpu(0, mine, child, squatter, used=4 * GIB), gpu(1, elsewhere, used=3 * GIB))
    leases = [lease(0, "ann", 12)]  # pid 12 is the holder itself: reserved although no user
    doc = valid(build(snap, leases=leases, now=NOW))
    flags = [p["reserved"] for p in doc["gpus"][0]["processes"]]
    assert flags == [True, True, False]
    assert doc["gpus"][1]["processes"][0]["reserved"] is False
    users = {u["user"]: u for u in doc["users"]}
    assert users["bob"]["used_gpus"] == [0, 1] and users["bob"]["unreserved"] == 2
    assert users["bob"]["memory"] == 5 * GIB and users["bob"]["leased_gpus"] == []
    assert users["ann"]["leased_gpus"] == [0] and users["ann"]["unreserved"] == 0
    assert users["?"]["processes"] == 1
    assert doc["users"][0]["user"] == "bob"  # most GPUs in use first


def test_reserved_rule():
    held = [lease(0, "ann", 5)]
    assert reserved(GpuProcess(5, None, user="zed"), held)
    assert reserved(GpuProcess(6, None, user="ann"), held)
    assert not reserved(GpuProcess(6, None, user="zed"), held)
    assert not reserved(GpuProcess(6, None, user=None), held)
    assert not reserved(GpuProcess(5, None, user="ann"), [])


def test_health_drain_and_faults():
    snap = machine(gpu(0), gpu(1))
    findings = {"GPU-0001": (Symptom("fatal", "XID 79 (fallen off the bus)", "reboot", "xid-79"),)}
    drains = {"GPU-0001": Drain("GPU-0001", "fan noise <b>loud</b>", "ann", NOW - 5)}
    events = [
        {"uuid": "GPU-0000", "xid": 13, "at": NOW - 20},
        {"uuid": "GPU-0001", "xid": 79, "at": NOW - 10},
        {"uuid": "GPU-gone", "xid": 31, "at": NOW - 5},
        {"uuid": "GPU-0000", "xid": "not a number"},  # a corrupt line costs itself only
    ]
    doc = valid(build(snap, drains=drains, findings=findings, xid_events=events, now=NOW))
    g1 = doc["gpus"][1]
    assert g1["health"]["level"] == "fatal"
    assert g1["drain"]["reason"] == "fan noise <b>loud</b>"  # text; the page never parses it
    assert doc["gpus"][0]["health"]["level"] == "ok" and doc["gpus"][0]["drain"] is None
    faults = doc["faults"]
    assert [f["xid"] for f in faults] == [31, 79, 13]  # newest first
    assert [f["index"] for f in faults] == [None, 1, 0]
    assert [f["fatal"] for f in faults] == [False, True, False]
    custom = build(snap, xid_events=events[:1], now=NOW, fatal_xids={13})
    assert custom["faults"][0]["fatal"] is True


def test_waitline_entries():
    waiter = Waiter("k1", "cat", 77, NOW - 30, Request(count=2))
    doc = valid(build(machine(gpu(0)), waiters=[waiter], now=NOW, describe=describe_request))
    assert doc["waitline"] == [
        {"user": "cat", "pid": 77, "since": NOW - 30, "waited": 30.0, "wants": "2 GPUs"}
    ]


def test_hostile_strings_are_bounded_text():
    long = "x" * 10_000
    evil = GpuProcess(pid=1, used_memory=GIB, user="u" * 500, command=long)
    snap = machine(gpu(0, evil, used=GIB))
    weird = lease(0, "ann", 2, job={"not": "a string"}, command=long)
    drains = {"GPU-0000": Drain("GPU-0000", long, "ann", NOW)}
    doc = valid(build(snap, leases=[weird], drains=drains, now=NOW, show_commands=True))
    g = doc["gpus"][0]
    assert len(g["drain"]["reason"]) == TEXT_LIMIT
    assert len(g["processes"][0]["command"]) == TEXT_LIMIT
    assert len(g["processes"][0]["user"]) == TEXT_LIMIT
    assert g["leases"][0]["job"] == "{'not': 'a string'}"


def test_history_buckets_and_series():
    h = History(span=60, points=6)  # 10 s buckets
    for t, util, temp in [(0, 10, 40), (5, 30, 50), (12, 50, 45), (13, None, None)]:
        one = Gpu(0, "GPU-a", utilization_gpu=util, temperature=temp)
        h.add(Snapshot(1000.0 + t, "h", gpus=(one,)))
    series = h.series()["GPU-a"]
    assert series["t"] == [1000.0, 1010.0]
    assert series["utilization"] == [20.0, 50.0]
    assert series["temperature"] == [50, 45]  # the hottest in each bucket
    h.add(Snapshot(1000.0 + 500, "h", gpus=(Gpu(0, "GPU-a", utilization_gpu=1),)))
    series = h.series()["GPU-a"]
    assert series["t"] == [1500.0]  # buckets older than the span are not shown
    doc = valid(build(machine(gpu(0)), history={"GPU-0000": series}, now=NOW))
    assert doc["gpus"][0]["history"]["utilization"] == [1.0]


def test_history_is_bounded():
    h = History(span=100, points=10)
    for t in range(1000):
        h.add(Snapshot(float(t), "h", gpus=(Gpu(0, "GPU-a", utilization_gpu=5),)))
    assert len(h.series()["GPU-a"]["t"]) == 10
    with pytest.raises(ValueError):
        History(span=0)


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
def test_numbers_json_cannot_carry_become_null(bad):
    """Lease and wait-line files are written by their holders and Python's json reads
    NaN; one such file must not stop the page (JSON has no NaN)."""
    snap = machine(gpu(0))
    doc = valid(
        build(
            snap,
            leases=[lease(0, "ann", 2, started=bad, expires=bad)],
            drains={"GPU-0000": Drain("GPU-0000", "r", "ann", bad)},
            waiters=[Waiter("k", "cat", 3, bad, Request())],
            xid_events=[{"uuid": "GPU-0000", "xid": 13, "at": bad}],
            now=NOW,
        )
    )
    held = doc["gpus"][0]["leases"][0]
    assert held["started"] is None and held["age"] is None and held["expires_in"] is None
    assert doc["gpus"][0]["drain"]["at"] is None
    assert doc["waitline"][0]["waited"] is None
    assert doc["faults"][0]["at"] is None
