"""GPUs booked ahead for a user or a group: what the plan keeps free, pure functions.

A booking is a number of GPUs for a window of time (`gpuwarden book -g 2 --start 16:00
--for 4h --user alice`), not particular GPUs: during its window its audience (the user,
or the members of the group) can always find that many GPUs, and before it the GPUs
are anyone's for jobs that end in time. So a job outside the audience may start now
only if, at every booking's start that its run would reach (by its `--time`; without
one it runs for ever), enough GPUs would still be free of everyone else's jobs for the
bookings then in force (`blocking`). Backfill before the window follows: a job whose
`--time` ends before the start is never held back. The service checks at booking time
that overlapping bookings fit on the machine together (`crowded`).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import NamedTuple, Optional


class Booking(NamedTuple):
    """`count` GPUs from `start` to `end` (seconds since the epoch) for `users`."""

    id: int
    count: int  # type: ignore[assignment]  # GPUs; shadows tuple.count, never called here
    start: float
    end: float
    users: frozenset[str]  # the audience: the booked user, or the group's members


class Holder(NamedTuple):
    """Someone holding GPUs until `ends` (inf: no end known)."""

    user: str
    gpus: tuple[str, ...]
    ends: float


def in_force(bookings: Iterable[Booking], at: float) -> list[Booking]:
    return [b for b in bookings if b.start <= at < b.end]


def blocking(
    user: str,
    ends: float,
    chosen: Sequence[str],
    now: float,
    bookings: Sequence[Booking],
    usable: int,
    holders: Iterable[Holder],
) -> Optional[Booking]:
    """The booking that `user`'s job on `chosen`, running until `ends`, would crowd out
    (None: it may start). Checked at each booking's start within the run (or now, for a
    booking in force): the GPUs free then of everyone outside the bookings' audiences,
    this job included, must cover the bookings in force then that are not this user's."""
    held = list(holders)
    for booking in sorted(bookings, key=lambda b: b.start):
        if user in booking.users or booking.end <= now or ends <= booking.start:
            continue
        at = max(booking.start, now)
        others = [b for b in in_force(bookings, at) if user not in b.users]
        need = sum(b.count for b in others)
        audience = frozenset().union(*(b.users for b in others))
        taken = {g for h in held if h.ends > at and h.user not in audience for g in h.gpus}
        taken.update(chosen)
        if usable - len(taken) < need:
            return booking
    return None


def crowded(new: Booking, bookings: Iterable[Booking], usable: int) -> list[Booking]:
    """The bookings `new` overlaps when, together, they would need more GPUs than the
    machine has at some moment (empty: it fits)."""
    overlapping = [b for b in bookings if b.start < new.end and new.start < b.end]
    moments = sorted({new.start, *(b.start for b in overlapping if b.start > new.start)})
    for at in moments:
        now_on = [b for b in overlapping if b.start <= at < b.end]
        if new.count + sum(b.count for b in now_on) > usable:
            return now_on
    return []


def ends_of(started: float, time_limit: Optional[float]) -> float:
    return math.inf if time_limit is None else started + time_limit
