"""GPUs booked ahead in the queue service: `gpuwarden book`, `book --list`, `book --cancel`.

A lab books GPUs for a deadline or a course: N GPUs from a start for a while, for a
user or a group. Bookings live in the journal (their own table, beside the jobs) and
reach every plan as `gpuwarden.planning.booking.Booking`s, which keep that many GPUs free of
others' jobs in the window while letting jobs that end before it use them. Who may
book: admins, for anyone; other users for themselves (or a group of theirs) within the
admin's `service.book_max_gpus` and `service.book_max_time` (none by default). A
booking that would not fit beside the ones it overlaps is refused, naming them.
"""

from __future__ import annotations

import grp
import logging
import pwd
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Optional

from gpuwarden.base import checked as fields
from gpuwarden.base.errors import UserError
from gpuwarden.planning import booking
from gpuwarden.queueclient import protocol
from gpuwarden.service import store
from gpuwarden.service.identity import Person

if TYPE_CHECKING:
    from gpuwarden.service.settings import Settings

log = logging.getLogger("gpuwarden.serve")

_SCHEMA = """
CREATE TABLE IF NOT EXISTS bookings (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    count INTEGER NOT NULL,
    start REAL NOT NULL,
    end REAL NOT NULL,
    user TEXT,
    grp TEXT,
    reason TEXT NOT NULL,
    by TEXT NOT NULL,
    made REAL NOT NULL,
    cancelled REAL
)
"""
MAX_REASON = 200
MAX_AHEAD = 366 * 86400.0  # a booking starts within a year
MAX_LENGTH = 31 * 86400.0
#: Bookings one user (or one group) may have not yet over, unless an admin made them.
MAX_FUTURE = 8


def _within_bounds(
    rows: list[dict[str, Any]],
    settings: Settings,
    admin: bool,
    count: int,
    start: float,
    end: float,
    user: Optional[str],
    group: Optional[str],
) -> None:
    """Refuse, in one line, a booking over its holder's bounds: GPUs no user may use at
    once (`max_gpus_per_user`: they would sit idle), and, for a user's own booking, its
    GPUs summed with the holder's bookings it overlaps over `book_max_gpus`, or more
    than MAX_FUTURE bookings not yet over."""
    cap = most_at_once(settings, user, group)
    if cap is not None and count > cap[0]:
        whom = "a user" if group is None else f"the members of group {group} together"
        raise UserError(
            f"{count} GPUs is more than the {cap[0]} {whom} may use at once "
            f"({cap[1]}): the booking would sit idle"
        )
    if admin:
        return
    mine = [r for r in rows if (r["grp"] == group if group else r["user"] == user)]
    holder = f"group {group}" if group else user
    if len(mine) >= MAX_FUTURE:
        raise UserError(f"{holder} already has {len(mine)} bookings, the most one may have")
    overlapping = sum(int(r["count"]) for r in mine if r["start"] < end and r["end"] > start)
    most = settings.book_max_gpus
    if most is not None and overlapping + count > most:
        raise UserError(
            f"{holder} has {overlapping} GPUs booked in that window; {count} more is over "
            f"the {most} a user may book (service.book_max_gpus)"
        )


def _members(group: str) -> list[str]:
    """The users of `group`: those it lists and those whose primary group it is."""
    try:
        found = grp.getgrnam(group)
    except KeyError:
        return []
    named = set(found.gr_mem)
    named.update(p.pw_name for p in pwd.getpwall() if p.pw_gid == found.gr_gid)
    return sorted(named)


def most_at_once(
    settings: Settings, user: Optional[str], group: Optional[str]
) -> Optional[tuple[int, str]]:
    """The GPUs a booking's holder may use at once, and the rules that say so: a user's
    `max_gpus` ([service.limits], else `max_gpus_per_user`); a group's, its members'
    summed. None: no bound (an admin or a member without one)."""
    from gpuwarden.service.identity import person

    machine = {"max_gpus_per_user": settings.policy.max_gpus_per_user}
    total, rules = 0, set()
    for name in [user] if group is None else _members(group):
        try:
            who = person(pwd.getpwnam(str(name)).pw_uid)
        except (KeyError, UserError):
            continue
        limit = settings.limits.of(who.name, who.groups, machine).get("max_gpus")
        if settings.admins.include(who) or limit is None:
            return None
        total += int(limit.value)
        rules.add(limit.rule)
    return total, ", ".join(sorted(rules)) or "no member"


#: Bookings `queue` shows (soonest first); `gpuwarden book --list` shows every one.
QUEUE_LINES = 10


def for_queue(table: Bookings, now: float) -> dict[str, Any]:
    """What `queue` shows of the bookings: at most QUEUE_LINES, and how many there are."""
    rows = table.current(now)
    return {"bookings": [shown(r) for r in rows[:QUEUE_LINES]], "bookings_total": len(rows)}


class Bookings:
    """The bookings of one journal (`store.Store`), in its transactions."""

    def __init__(self, journal: store.Store) -> None:
        self.journal = journal
        with journal.transaction():
            journal.db.execute(_SCHEMA)
        # The bookings not cancelled nor over when read, and the journal's rollbacks
        # then: every pass asks for them, and they change only by `add` and `cancel`.
        self._kept: Optional[tuple[list[dict[str, Any]], int]] = None

    def current(self, now: float) -> list[dict[str, Any]]:
        """Bookings not cancelled and not over at `now`, by start."""
        if self._kept is None or self._kept[1] != self.journal.rollbacks:
            query = "SELECT * FROM bookings WHERE cancelled IS NULL AND end > ? ORDER BY start, id"
            rows = [dict(r) for r in self.journal.db.execute(query, (now,))]
            self._kept = (rows, self.journal.rollbacks)
        return [dict(r) for r in self._kept[0] if r["end"] > now]

    def get(self, booking_id: int) -> Optional[dict[str, Any]]:
        row = self.journal.db.execute(
            "SELECT * FROM bookings WHERE id = ?", (booking_id,)
        ).fetchone()
        return None if row is None else dict(row)

    def add(self, row: dict[str, Any]) -> int:
        names = ", ".join(row)
        marks = ", ".join("?" for _ in row)
        self._kept = None  # read again, with it
        with self.journal.transaction():
            cursor = self.journal.db.execute(
                f"INSERT INTO bookings ({names}) VALUES ({marks})", list(row.values())
            )
        return int(cursor.lastrowid or 0)

    def cancel(self, booking_id: int, now: float) -> None:
        self._kept = None
        with self.journal.transaction():
            self.journal.db.execute(
                "UPDATE bookings SET cancelled = ? WHERE id = ?", (now, booking_id)
            )


def audience(row: dict[str, Any], users: set[str]) -> frozenset[str]:
    """Who of `users` a booking is for: its user, or the members of its group."""
    if row.get("user"):
        return frozenset({str(row["user"])})
    try:
        group = grp.getgrnam(str(row.get("grp")))
    except KeyError:
        return frozenset()
    from gpuwarden.service.identity import person

    members: set[str] = set()
    for user in users:
        try:
            import pwd

            if group.gr_gid in person(pwd.getpwnam(user).pw_uid).groups:
                members.add(user)
        except (KeyError, UserError):
            continue
    return frozenset(members)


def for_plan(rows: list[dict[str, Any]], users: set[str]) -> list[booking.Booking]:
    """The plan's view of the current bookings, their audience among `users`."""
    return [
        booking.Booking(int(r["id"]), int(r["count"]), r["start"], r["end"], audience(r, users))
        for r in rows
    ]


def shown(row: dict[str, Any]) -> dict[str, Any]:
    """A booking as `book --list` and `queue` answer it."""
    return {
        "id": row["id"],
        "count": row["count"],
        "start": row["start"],
        "end": row["end"],
        "user": row["user"],
        "group": row["grp"],
        "reason": row["reason"],
        "by": row["by"],
    }


def _words(row: dict[str, Any]) -> str:
    whom = row["user"] if row.get("user") else "@" + str(row["grp"])
    start = time.strftime("%Y-%m-%d %H:%M", time.localtime(row["start"]))
    end = time.strftime("%Y-%m-%d %H:%M", time.localtime(row["end"]))
    return f"booking {row['id']} ({row['count']} GPUs for {whom}, {start} to {end})"


def handle(
    table: Bookings,
    settings: Settings,
    usable: int,
    who: Person,
    op: str,
    message: Mapping[str, Any],
) -> dict[str, Any]:
    """The `book`, `bookings` and `unbook` requests."""
    now = time.time()
    if op == "bookings":
        return {"ok": True, "bookings": [shown(r) for r in table.current(now)]}
    admin = settings.admins.include(who)
    if op == "unbook":
        (booking_id,) = protocol.job_ids([message.get("booking")], "booking")
        row = table.get(booking_id)
        if row is None or row["cancelled"] is not None:
            raise UserError(f"no booking {booking_id}")
        if not admin and who.name not in (row["by"], row["user"]):
            raise UserError(
                f"booking {booking_id} was made by {row['by']}: only they, its user or an "
                "admin may cancel it"
            )
        table.cancel(booking_id, now)
        log.info("booking %s cancelled by %s", booking_id, who.name)
        return {"ok": True, "booking": booking_id}
    return _book(table, settings, usable, who, admin, message, now)


def _book(
    table: Bookings,
    settings: Settings,
    usable: int,
    who: Person,
    admin: bool,
    message: Mapping[str, Any],
    now: float,
) -> dict[str, Any]:
    count = fields.checked_int(message.get("count"), "count", 1, 1024)
    start = fields.checked_number(message.get("start"), "start", 0.0, 1e11)
    length = fields.checked_number(message.get("length"), "length", 1.0, MAX_LENGTH)
    reason = str(fields.checked_string(message.get("reason"), "reason", MAX_REASON))
    user = message.get("user")
    group = message.get("group")
    if user is not None and group is not None:
        raise UserError("a booking is for a user or for a group, not both")
    if group is not None:
        group = str(fields.checked_string(group, "group", 64))
        try:
            members = grp.getgrnam(group)
        except KeyError:
            raise UserError(f"no group {group!r}") from None
    else:
        user = who.name if user is None else str(fields.checked_string(user, "user", 64))
        try:
            pwd.getpwnam(user)
        except KeyError:
            raise UserError(f"no user {user!r}") from None
    start = max(start, now)  # a start in the past is now, as sbatch's --begin
    if start - now > MAX_AHEAD:
        raise UserError("a booking starts within a year")
    if not admin:
        most_gpus, most_time = settings.book_max_gpus, settings.book_max_time
        if most_gpus is None:
            raise UserError("only an admin may book GPUs on this machine (service.book_max_gpus)")
        if group is not None and members.gr_gid not in who.groups:
            raise UserError(f"you are not in group {group}: you may book only for yourself or it")
        if user is not None and user != who.name:
            raise UserError("only an admin may book GPUs for another user")
        if count > most_gpus:
            raise UserError(f"{count} GPUs is over the {most_gpus} a user may book")
        if most_time is not None and length > most_time:
            from gpuwarden.base.units import format_span

            raise UserError(
                f"a booking of {format_span(length)} is over the {format_span(most_time)} "
                "a user may book (service.book_max_time)"
            )
    if count > usable:
        raise UserError(f"this machine has {usable} GPUs: {count} cannot be booked")
    rows = {int(r["id"]): r for r in table.current(now)}
    _within_bounds(list(rows.values()), settings, admin, count, start, start + length, user, group)
    new = booking.Booking(0, count, start, start + length, frozenset())
    clash = booking.crowded(new, for_plan(list(rows.values()), set()), usable)
    if clash:
        named = "; ".join(_words(rows[b.id]) for b in clash)
        raise UserError(
            f"{count} GPUs from then would not fit beside {named} on this machine's {usable} GPUs"
        )
    booking_id = table.add(
        {
            "count": count,
            "start": start,
            "end": start + length,
            "user": user if group is None else None,
            "grp": group,
            "reason": reason,
            "by": who.name,
            "made": now,
        }
    )
    log.info("booking %s by %s: %s GPUs", booking_id, who.name, count)
    return {"ok": True, "booking": booking_id, "start": start, "end": start + length}
