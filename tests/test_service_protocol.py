"""The service's wire format: every malformed request is one line, never a traceback."""

from __future__ import annotations

import json

import pytest

from gpuwarden.queueclient import protocol as p

GOOD = {
    "v": 1,
    "op": "submit",
    "argv": ["python", "train.py"],
    "cwd": "/home/alice",
    "env": {"PATH": "/usr/bin"},
    "umask": 0o022,
    "request": {"count": 2, "mem": 20 * 2**30},
    "time_limit": 3600,
}


def test_a_good_submit_round_trips() -> None:
    (msg,) = p.Decoder().feed(p.encode(GOOD))
    sub = p.submit(msg)
    assert sub.argv == ("python", "train.py") and sub.gpus.count == 2
    assert sub.gpus.mem == 20 * 2**30 and sub.time_limit == 3600.0 and not sub.attached


def test_messages_split_across_reads() -> None:
    data = p.encode({"v": 1, "op": "queue"}) + p.encode({"v": 1, "op": "share"})
    d = p.Decoder()
    out = []
    for i in range(len(data)):
        out += d.feed(data[i : i + 1])
    assert [m["op"] for m in out] == ["queue", "share"]


def test_an_endless_line_is_refused_before_it_is_all_buffered() -> None:
    d = p.Decoder()
    with pytest.raises(p.ProtocolError, match="larger than"):
        for _ in range(p.MAX_MESSAGE // 65536 + 2):
            d.feed(b"x" * 65536)
    assert len(d.buffer) <= p.MAX_MESSAGE + 65536


LINES = [
    b"not json\n",
    b"[1,2]\n",
    b'"text"\n',
    b"\xff\xfe\n",
    b'{"op":"queue"}\n',
    b'{"v":2,"op":"queue"}\n',
    b'{"v":"1","op":"queue"}\n',
    b'{"v":1,"op":"queue","x":NaN}\n',
    b'{"v":1,"op":"queue","x":Infinity}\n',
]


@pytest.mark.parametrize("line", LINES)
def test_malformed_lines(line: bytes) -> None:
    with pytest.raises(p.ProtocolError):
        p.Decoder().feed(line)


@pytest.mark.parametrize("op", [None, 3, "", "drop_tables", "SUBMIT"])
def test_unknown_operations(op: object) -> None:
    with pytest.raises(p.ProtocolError, match="unknown operation"):
        p.op_of({"v": 1, "op": op})


def bad(**changes: object) -> dict:
    msg = json.loads(json.dumps(GOOD))
    for key, value in changes.items():
        if value is ...:
            msg.pop(key)
        else:
            msg[key] = value
    return msg


SUBMITS = [
    (bad(argv=...), "argv"),
    (bad(argv=[]), "argv"),
    (bad(argv="python train.py"), "argv"),
    (bad(argv=["", "x"]), "argv"),
    (bad(argv=["py\0thon"]), "argv"),
    (bad(argv=["python", 3]), "argv"),
    (bad(cwd=...), "cwd"),
    (bad(cwd="relative/dir"), "cwd"),
    (bad(cwd=""), "cwd"),
    (bad(cwd="/a\0b"), "cwd"),
    (bad(cwd="/" + "x" * 5000), "cwd"),
    (bad(env=[]), "env"),
    (bad(env={"A": 1}), "env"),
    (bad(env={"A=B": "c"}), "env name"),
    (bad(env={"": "c"}), "env name"),
    (bad(umask=-1), "umask"),
    (bad(umask=0o1000), "umask"),
    (bad(umask="022"), "umask"),
    (bad(umask=True), "umask"),
    (bad(request=[]), "request"),
    (bad(request={"count": -1}), "request.count"),
    (bad(request={"count": 2.5}), "request.count"),
    (bad(request={"count": 10**9}), "request.count"),
    (bad(request={"mem": 0}), "request.mem"),
    (bad(request={"mem": -5}), "request.mem"),
    (bad(request={"mem": "20GiB"}), "request.mem"),
    (bad(request={"max_util": 101}), "request.max_util"),
    (bad(request={"min_capability": [8]}), "min_capability"),
    (bad(request={"min_capability": ["8", "0"]}), "min_capability"),
    (bad(request={"gpus": "0,1"}), "request.gpus"),
    (bad(request={"gpus": []}), "names no GPU"),
    (bad(request={"gpus": [""]}), "names no GPU"),
    (bad(request={"model": ""}), "request.model"),
    (bad(output=""), "output"),
    (bad(request={"colour": "red"}), "unknown fields"),
    (bad(time_limit=0), "time_limit"),
    (bad(time_limit=-60), "time_limit"),
    (bad(time_limit="1h"), "time_limit"),
    (bad(time_limit=1e12), "time_limit"),
    (bad(nice=-21), "nice"),
    (bad(nice=20), "nice"),
    (bad(hold="yes"), "hold"),
    (bad(after=[0]), "job id"),
    (bad(after=["3"]), "job id"),
    (bad(after=3), "after"),
    (bad(output="out.txt"), "output"),
    (bad(attached=1), "attached"),
]


@pytest.mark.parametrize(("msg", "names"), SUBMITS)
def test_malformed_submits_name_the_field(msg: dict, names: str) -> None:
    with pytest.raises(p.ProtocolError, match=names):
        p.submit(msg)


def test_signals_a_client_may_send() -> None:
    assert p.signal_number(2) == 2
    for value in (0, 65, "2", 19, True):
        with pytest.raises(p.ProtocolError):
            p.signal_number(value)


def test_job_ids() -> None:
    assert p.job_ids([1, 2]) == (1, 2)
    for value in ([], [0], [-1], ["1"], [True], list(range(1, 2000)), "1"):
        with pytest.raises(p.ProtocolError):
            p.job_ids(value)


def test_nesting_is_counted_outside_strings_and_refused_before_parsing() -> None:
    from gpuwarden.queueclient.depth import nesting

    assert nesting(b'{"a":"[[[[{{{{","b":[1,[2]]}', 16) == 3
    assert nesting(b'{"a":"x\\"[[[["}', 16) == 1  # an escaped quote does not end the string
    assert nesting(b"[" * p.MAX_DEPTH + b"]" * p.MAX_DEPTH, p.MAX_DEPTH) == p.MAX_DEPTH
    p.parse(b'{"v":1,"x":' + b"[" * (p.MAX_DEPTH - 1) + b"]" * (p.MAX_DEPTH - 1) + b"}")
    for line in (b"[" * 50000, b'{"v":1,"x":' + b'{"a":' * 100 + b"1" + b"}" * 101):
        with pytest.raises(p.ProtocolError, match=r"the most is 16 \(MAX_DEPTH\)"):
            p.parse(line)


def test_listings_are_checked() -> None:
    assert p.listing({}) == p.Listing(limit=p.PAGE_ROWS, offset=0)
    assert p.listing({"limit": 3, "offset": 6, "user": "ann", "ids": [4]}).ids == (4,)
    for bad_one in (
        {"limit": 0},
        {"limit": p.MAX_PAGE_ROWS + 1},
        {"offset": -1},
        {"user": 5},
        {"ids": []},
        {"limit": "9"},
    ):
        with pytest.raises(p.ProtocolError):
            p.listing(bad_one)


def test_a_page_stops_at_its_bytes_and_says_where_the_next_begins() -> None:
    from gpuwarden.service import listing
    from gpuwarden.service import store as st

    jobs = [
        st.Job(
            id=i,
            uid=1,
            gid=1,
            user="ann",
            argv=("sh", "-c", "x" * 100_000),
            cwd="/",
            env={},
            umask=18,
            request={},
            state=st.PENDING,
            submitted=float(i),
        )
        for i in range(1, 1001)
    ]
    ask = p.listing({"limit": 5000})
    page = listing.page(
        jobs, ask, len(jobs), lambda j: {"id": j.id, "command": listing.command(j.argv)}
    )
    assert 50 < len(page["jobs"]) < 1000 and page["next"] == len(page["jobs"])
    assert len(p.encode(page)) <= p.PAGE_BYTES + 100
    assert page["jobs"][0]["command"][-1].endswith("…")
    assert len(" ".join(page["jobs"][0]["command"])) <= listing.COMMAND_CHARS + 1
    last = listing.page(jobs[990:], p.listing({"offset": 990}), len(jobs), lambda j: {"id": j.id})
    assert last["next"] is None and [r["id"] for r in last["jobs"]] == list(range(991, 1001))


def test_every_operation_of_the_protocol_has_its_handler_and_record() -> None:
    from gpuwarden.service.requests import OPERATIONS

    assert set(OPERATIONS) == set(p.OPS)
    assert p.signalling({"job": 3, "signal": 15}) == p.Signal(job=3, number=15)
    with pytest.raises(p.ProtocolError, match="job id must be an integer"):
        p.one_job({})


@pytest.mark.parametrize(
    "request_",
    [
        {},
        {"count": 0},
        {"gpus": ("6", "GPU-ab12"), "exclude": ("0",)},
        {"count": 2, "min_free": 20 << 30, "max_util": 12.5, "model": "A100*"},
        {"min_capability": (8, 0), "mem": 5 << 30},
        {"mig": "1g.10gb"},
    ],
)
def test_a_gpu_request_crosses_the_wire_and_the_journal_unchanged(request_: dict) -> None:
    """One request type and one conversion each way: what a client sends is what the
    service reads back, from the message and from the job's record (JSON both)."""
    from dataclasses import replace

    from gpuwarden.placement.request import Request
    from gpuwarden.placement.requestwire import from_wire, to_wire

    sent = Request(**request_)
    wire = json.loads(json.dumps(to_wire(sent)))
    got = from_wire(wire)
    assert got == replace(sent, count=sent.gpu_count)
    stored = {**wire, "signal": [10, 60.0, False], "max_retries": 2}  # beside it in a record
    assert from_wire(stored, others=True) == got
    with pytest.raises(p.ProtocolError, match="unknown fields: max_retries, signal"):
        from_wire(stored)
