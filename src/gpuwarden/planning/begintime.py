"""A point in time as sbatch's `--begin` reads it, for `submit --begin` and `book --start`.

The forms (Slurm's, sbatch(1)): `now`, `now+N` with a unit (`seconds`, `minutes`,
`hours`, `days`, `weeks`, singular or plural; a bare number is seconds), a time of day
`HH:MM[:SS]` (the next such time: tomorrow's once today's has passed), a date
`YYYY-MM-DD` with an optional `THH:MM[:SS]`, `MM/DD[/YY]` likewise, and the words
`today`, `tomorrow`, `midnight`, `noon`, `teatime` (16:00). `parse` takes the present
moment as an argument (no clock is read here) and the time zone is the process's
local one, as sbatch's. A time in the past is returned as it is: the caller starts
such a job now, as sbatch does.
"""

from __future__ import annotations

import re
import time

from gpuwarden.base.errors import UserError

_UNITS = {
    "s": 1,
    "sec": 1,
    "second": 1,
    "m": 60,
    "min": 60,
    "minute": 60,
    "h": 3600,
    "hour": 3600,
    "d": 86400,
    "day": 86400,
    "w": 7 * 86400,
    "week": 7 * 86400,
}
_RELATIVE = re.compile(r"now(?:\+(\d{1,9})([a-z]*))?")
_CLOCK = r"(\d{1,2}):(\d{2})(?::(\d{2}))?"
_ISO = re.compile(r"(\d{4})-(\d{2})-(\d{2})(?:t" + _CLOCK + ")?")  # matched lower-cased
_US = re.compile(r"(\d{1,2})/(\d{1,2})(?:/(\d{2}))?(?:-" + _CLOCK + ")?")
_WORDS = {"midnight": (0, 0), "noon": (12, 0), "teatime": (16, 0)}
FORMS = "now+1hour, 16:00, 2026-12-24T09:00, tomorrow"


#: The latest moment the service takes (its protocol's bound, in the year 5138).
LATEST = 1e11


def parse(text: str, now: float) -> float:
    """The moment `text` names (seconds since the epoch), `now` being the present."""
    moment = _parse(text, now)
    if moment > LATEST:
        raise UserError(f"invalid time {text[:60]!r}: the latest is the year 5000")
    return moment


def _parse(text: str, now: float) -> float:
    spec = text.strip().lower()
    relative = _RELATIVE.fullmatch(spec)
    if relative:
        count, unit = relative.group(1), relative.group(2)
        if count is None:
            return now
        factor = _unit(text, unit)
        return now + int(count) * factor
    local = time.localtime(now)
    if spec in ("today", "tomorrow"):
        day = _moment(text, local.tm_year, local.tm_mon, local.tm_mday, 0, 0, 0)
        return _next_day(day) if spec == "tomorrow" else day
    if spec in _WORDS:
        hour, minute = _WORDS[spec]
        return _upcoming(text, local, hour, minute, 0, now)
    clock = re.fullmatch(_CLOCK, spec)
    if clock:
        hour, minute, second = (int(g or 0) for g in clock.groups())
        return _upcoming(text, local, hour, minute, second, now)
    iso = _ISO.fullmatch(spec)
    if iso:
        year, month, day = int(iso.group(1)), int(iso.group(2)), int(iso.group(3))
        hour, minute, second = (int(g or 0) for g in iso.groups()[3:])
        return _moment(text, year, month, day, hour, minute, second)
    us = _US.fullmatch(spec)
    if us:
        month, day = int(us.group(1)), int(us.group(2))
        year = local.tm_year if us.group(3) is None else 2000 + int(us.group(3))
        hour, minute, second = (int(g or 0) for g in us.groups()[3:])
        moment = _moment(text, year, month, day, hour, minute, second)
        if us.group(3) is None and moment < now:  # as Slurm: passed this year, next year's
            moment = _moment(text, year + 1, month, day, hour, minute, second)
        return moment
    raise UserError(f"invalid time {text[:60]!r}: expected a form such as {FORMS}")


def _unit(text: str, unit: str) -> int:
    name = unit[:-1] if unit.endswith("s") and len(unit) > 1 else unit
    if not unit:
        return 1
    if name not in _UNITS:
        raise UserError(
            f"invalid time {text[:60]!r}: the unit {unit!r} is not seconds, minutes, hours, "
            "days or weeks"
        )
    return _UNITS[name]


def _moment(text: str, year: int, month: int, day: int, hour: int, minute: int, sec: int) -> float:
    if not (1 <= month <= 12 and 1 <= day <= 31 and hour <= 23 and minute <= 59 and sec <= 59):
        raise UserError(f"invalid time {text[:60]!r}: no such date or time of day")
    if not 1970 <= year <= 5000:
        raise UserError(f"invalid time {text[:60]!r}: the year must be 1970 to 5000")
    stamp = time.mktime((year, month, day, hour, minute, sec, 0, 0, -1))
    if time.localtime(stamp)[:3] != (year, month, day):
        raise UserError(f"invalid time {text[:60]!r}: no such date")
    return stamp


def _next_day(stamp: float) -> float:
    """The same time of day one calendar day later (a DST change in between counts)."""
    t = time.localtime(stamp + 26 * 3600)
    return time.mktime((t.tm_year, t.tm_mon, t.tm_mday, *time.localtime(stamp)[3:6], 0, 0, -1))


def _upcoming(
    text: str, local: time.struct_time, hour: int, minute: int, sec: int, now: float
) -> float:
    """Today's `hour:minute:sec`, or tomorrow's once today's has passed."""
    today = _moment(text, local.tm_year, local.tm_mon, local.tm_mday, hour, minute, sec)
    return today if today >= now else _next_day(today)


def describe(stamp: float, now: float) -> str:
    """A moment as `queue` and `book --list` show it: `16:00` today, else `12-24 09:00`."""
    if time.localtime(stamp)[:3] == time.localtime(now)[:3]:
        return time.strftime("%H:%M", time.localtime(stamp))
    return time.strftime("%m-%d %H:%M", time.localtime(stamp))
