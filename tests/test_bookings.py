"""--begin and GPUs booked ahead: the pure rules (planning.begintime, planning.booking)
and the queue service keeping booked GPUs free, as real users."""

from __future__ import annotations

import json
import math
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import waiting
from gpuwarden.base.errors import UserError
from gpuwarden.planning import begintime, booking
from servicetools import Server, cli_as, serving
from users import make_user

jsonschema = pytest.importorskip("jsonschema")
SCHEMAS = Path(__file__).resolve().parent.parent / "src" / "gpuwarden" / "schemas"

NOW = time.mktime((2026, 12, 2, 14, 30, 0, 0, 0, -1))  # a local 14:30


@pytest.mark.parametrize(
    ("text", "expect"),
    [
        ("now", NOW),
        ("now+1hour", NOW + 3600),
        ("now+90minutes", NOW + 5400),
        ("now+60", NOW + 60),
        ("now+2days", NOW + 2 * 86400),
        ("16:00", time.mktime((2026, 12, 2, 16, 0, 0, 0, 0, -1))),
        ("09:00", time.mktime((2026, 12, 3, 9, 0, 0, 0, 0, -1))),  # passed today: tomorrow
        ("2026-12-24T09:00", time.mktime((2026, 12, 24, 9, 0, 0, 0, 0, -1))),
        ("2020-01-01", time.mktime((2020, 1, 1, 0, 0, 0, 0, 0, -1))),  # past: the caller starts now
        ("12/24", time.mktime((2026, 12, 24, 0, 0, 0, 0, 0, -1))),
        ("teatime", time.mktime((2026, 12, 2, 16, 0, 0, 0, 0, -1))),
        ("tomorrow", time.mktime((2026, 12, 3, 0, 0, 0, 0, 0, -1))),
    ],
)
def test_begin_times_read_as_sbatch_reads_them(text: str, expect: float) -> None:
    assert begintime.parse(text, NOW) == expect


@pytest.mark.parametrize(
    "text", ["now+1fortnight", "25:00", "2026-13-01", "2026-02-30", "soon", ""]
)
def test_malformed_begin_times_are_one_line(text: str) -> None:
    with pytest.raises(UserError) as err:
        begintime.parse(text, NOW)
    assert "\n" not in str(err.value) and "invalid time" in str(err.value)


def test_a_booking_keeps_its_gpus_from_jobs_that_would_reach_its_window() -> None:
    soon = booking.Booking(1, 2, 1000.0, 5000.0, frozenset({"alice"}))
    held = [booking.Holder("carol", ("g0",), math.inf)]
    # 4 GPUs, 1 held for ever: bob's endless job on g1 leaves 2 for the booking; a second not.
    assert booking.blocking("bob", math.inf, ("g1",), 0.0, [soon], 4, held) is None
    held.append(booking.Holder("bob", ("g1",), math.inf))
    assert booking.blocking("bob", math.inf, ("g2",), 0.0, [soon], 4, held) == soon
    assert booking.blocking("bob", 900.0, ("g2",), 0.0, [soon], 4, held) is None  # ends before
    assert booking.blocking("alice", math.inf, ("g2",), 0.0, [soon], 4, held) is None  # hers
    assert booking.blocking("bob", math.inf, ("g2",), 6000.0, [soon], 4, held) is None  # over
    other = booking.Booking(2, 3, 2000.0, 3000.0, frozenset({"bob"}))
    assert booking.crowded(other, [soon], 4) == [soon]
    assert booking.crowded(other._replace(start=5000.0, end=6000.0), [soon], 4) == []


def test_the_plan_backfills_booked_gpus_only_with_jobs_that_end_before_the_window() -> None:
    from gpuwarden.planning import scheduling as sch

    gpus = [sch.QueueGpu(f"g{i}", 80 << 30) for i in range(4)]
    soon = booking.Booking(1, 2, 1000.0, 5000.0, frozenset({"alice"}))
    waiting = [sch.Waiting(f"{i}", "bob", 1, float(i)) for i in range(1, 4)]  # no --time
    waiting.append(sch.Waiting("4", "bob", 1, 4.0, time_limit=900.0))  # ends before 1000
    waiting.append(sch.Waiting("5", "bob", 1, 5.0, begin=2000.0))
    got = {d.id: d for d in sch.plan(gpus, [], waiting, {}, 0.0, bookings=[soon])}
    assert [got[i].starts for i in "1234"] == [True, True, False, True]
    assert got["3"].reason == sch.BOOKED and got["5"].reason == sch.BEGIN_TIME
    # In the window, alice's job takes a kept GPU; bob's does not.
    busy = [sch.Running(f"r{i}", "bob", (f"g{i}",), 0.0) for i in range(2)]
    hers = [sch.Waiting("6", "alice", 1, 6.0), sch.Waiting("7", "bob", 1, 7.0)]
    got = {d.id: d for d in sch.plan(gpus, busy, hers, {}, 1500.0, bookings=[soon])}
    assert got["6"].starts and got["7"].reason == sch.BOOKED


@pytest.fixture
def server(tmp_path: Path, open_dir: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Server]:
    make_user("carol")  # the fixture's admin
    yield from serving(tmp_path, open_dir, monkeypatch)


def states(srv: Server, ids: list[int]) -> list[tuple[str, str]]:
    rows = {r["id"]: r for r in srv.call(None, "queue")["jobs"]}
    rows.update({r["id"]: r for r in srv.call(None, "jobs", limit=100)["jobs"]})
    return [(rows[i]["state"], rows[i]["reason"] or "") for i in ids]


def wait_for(srv: Server, ids: list[int], want: list[tuple[str, str]]) -> None:
    now: list[tuple[str, str]] = []

    def reached() -> bool:
        now[:] = states(srv, ids)
        return now == want

    waiting.wait_for(reached, 30, lambda: f"jobs {ids} in {want}, not {now}")


def test_begin_waits_with_its_reason_and_a_past_begin_starts_now(server: Server) -> None:
    alice = make_user("alice", ("lab",))
    later = cli_as(server, alice, "submit", "--begin", "now+1hour", "--", "true")
    past = cli_as(server, alice, "submit", "--begin", "2020-01-01T00:00", "--", "true")
    soon = cli_as(server, alice, "submit", "--begin", "now+1", "--", "true")
    ids = [int(later.stdout), int(past.stdout), int(soon.stdout)]
    wait_for(server, ids, [("PENDING", "BeginTime"), ("COMPLETED", ""), ("COMPLETED", "")])
    row = server.job(ids[2])
    assert row["started"] - row["submitted"] >= 0.5
    bad = cli_as(server, alice, "submit", "--begin", "teatime+1", "--", "true")
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "invalid time" in bad.stderr


def test_a_booking_keeps_two_gpus_for_its_window_while_backfill_uses_them_before(
    server: Server,
) -> None:
    alice, bob, carol = make_user("alice", ("lab",)), make_user("bob"), make_user("carol")
    made = cli_as(
        server, carol, "book", "-g", "2", "--start", "now+1hour", "--for", "2h",
        "--user", "gw-alice", "--reason", "course",
    )  # fmt: skip
    assert made.returncode == 0, made.stderr
    first = int(made.stdout)
    clash = cli_as(
        server, carol, "book", "-g", "3", "--start", "now+90minutes", "--for", "1h",
        "--reason", "x",
    )  # fmt: skip
    assert clash.returncode == 2 and f"booking {first} (2 GPUs for gw-alice" in clash.stderr
    assert clash.stderr.count("\n") == 1
    own = cli_as(server, bob, "book", "-g", "1", "--start", "now", "--for", "1h", "--reason", "x")
    assert own.returncode == 2 and "only an admin may book" in own.stderr
    long = [
        int(cli_as(server, bob, "submit", "--time", "2h", "--", "sleep", "60").stdout)
        for _ in range(4)
    ]
    wait_for(server, long, [("RUNNING", "")] * 2 + [("PENDING", "Booked")] * 2)
    short = [
        int(cli_as(server, bob, "submit", "--time", "30m", "--", "sleep", "60").stdout)
        for _ in range(2)
    ]
    wait_for(server, short, [("RUNNING", "")] * 2)  # backfill: they end before the window
    shown = cli_as(server, bob, "queue").stdout
    assert "booked [" in shown and "2 GPUs for gw-alice" in shown and "course" in shown, shown
    for job in short:
        server.call(None, "cancel", jobs=[job])
    # The window now: alice gets the two kept GPUs, bob's waiting jobs do not.
    now = cli_as(
        server, carol, "book", "-g", "2", "--start", "now", "--for", "1h", "--user", "gw-alice",
        "--reason", "deadline",
    )  # fmt: skip
    assert now.returncode == 0, now.stderr  # beside the first: 4 GPUs in all
    gone = cli_as(server, carol, "book", "--cancel", str(first))
    assert gone.returncode == 0, gone.stderr
    wait_for(server, long, [("RUNNING", "")] * 2 + [("PENDING", "Booked")] * 2)
    hers = int(cli_as(server, alice, "submit", "-g", "2", "--", "true").stdout)
    wait_for(server, [hers], [("COMPLETED", "")])
    listed = cli_as(server, alice, "book", "--list")
    assert "deadline" in listed.stdout and "course" not in listed.stdout, listed.stdout
    rows = json.loads(cli_as(server, alice, "book", "--list", "--json").stdout)
    jsonschema.validate(rows, json.loads((SCHEMAS / "book.json").read_text()))
    assert [(r["count"], r["user"], r["reason"]) for r in rows] == [(2, "gw-alice", "deadline")]
    for job in long:
        server.call(None, "cancel", jobs=[job])


def test_bookings_are_bounded_per_user_summed_and_counted(
    tmp_path: Path, open_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A user allowed 2 GPUs of bookings cannot book 3 in one window as 2 + 1, keeps at
    most MAX_FUTURE bookings, and nobody (an admin neither) books for a user more GPUs
    than a user may use at once, or for a user who does not exist."""
    from gpuwarden.service.bookings import MAX_FUTURE

    monkeypatch.setenv("GPUWARDEN_SERVICE_BOOK_MAX_GPUS", "2")
    srv_iter = serving(tmp_path, open_dir, monkeypatch, "--max-gpus-per-user", "3")
    srv = next(srv_iter)
    try:
        alice, carol = make_user("alice", ("lab",)), make_user("carol")

        def book(who: Any, *args: str) -> Any:
            return cli_as(srv, who, "book", "--reason", "x", *args)

        assert book(alice, "-g", "2", "--start", "now+1hour", "--for", "2h").returncode == 0
        more = book(alice, "-g", "1", "--start", "now+2hours", "--for", "1h")
        assert more.returncode == 2 and more.stderr.count("\n") == 1, more.stderr
        assert "has 2 GPUs booked in that window; 1 more is over the 2" in more.stderr
        later = [
            book(alice, "-g", "1", "--start", f"now+{d}days", "--for", "1h") for d in range(1, 9)
        ]
        assert [r.returncode for r in later].count(0) == MAX_FUTURE - 1, [r.stderr for r in later]
        assert "the most one may have" in later[-1].stderr
        wide = book(carol, "-g", "4", "--start", "now+1day", "--for", "1h", "--user", "gw-alice")
        assert wide.returncode == 2 and "more than the 3 a user may use at once" in wide.stderr
        nobody = book(carol, "-g", "1", "--start", "now+1day", "--for", "1h", "--user", "gw-nx")
        assert nobody.returncode == 2 and "no user 'gw-nx'" in nobody.stderr, nobody.stderr
    finally:
        for _ in srv_iter:
            pass


def test_a_group_booking_over_what_its_members_may_use_is_refused_and_queue_shows_ten(
    tmp_path: Path, open_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A booking for a group whose members together may use fewer GPUs than it keeps
    (their `max_gpus`) would sit idle: refused in one line naming the rule, for an admin
    too. `queue` shows at most ten bookings and says how many more `book --list` has."""
    from gpuwarden.service.bookings import QUEUE_LINES, _members

    srv_iter = serving(tmp_path, open_dir, monkeypatch, "--max-gpus-per-user", "1")
    srv = next(srv_iter)
    try:
        make_user("erin", ("booklab",))
        carol = make_user("carol")  # the admin
        members = len(_members("gw-booklab"))
        assert members >= 1

        def book(*args: str) -> Any:
            return cli_as(srv, carol, "book", "--reason", "x", "--for", "1h", *args)

        over = book("-g", str(members + 1), "--start", "now+1day", "--group", "@gw-booklab")
        assert over.returncode == 2 and over.stderr.count("\n") == 1, over.stderr
        assert f"more than the {members} the members of group gw-booklab" in over.stderr
        assert "(max_gpus_per_user)" in over.stderr
        assert book("-g", "1", "--start", "now+1day", "--group", "@gw-booklab").returncode == 0
        for hours in range(2, QUEUE_LINES + 5):
            done = book("-g", "1", "--start", f"now+{hours}hours", "--user", "gw-erin")
            assert done.returncode == 0, done.stderr
        shown = cli_as(srv, carol, "queue")
        assert shown.returncode == 0, shown.stderr
        assert shown.stdout.count("booked [") == QUEUE_LINES, shown.stdout
        assert "and 4 more bookings (`gpuwarden book --list`)" in shown.stdout
    finally:
        for _ in srv_iter:
            pass
