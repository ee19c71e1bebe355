"""The field checks of JSON another process wrote: every field a client sends the queue
service, or a waiter writes in its ticket, is checked for type and range here before
it is used, and a field that fails gets one line naming it (`ProtocolError`), never a
traceback. `queueclient.protocol` checks whole messages with them,
`placement.requestwire` a GPU request, service.bookings a booking.
"""

from __future__ import annotations

import math
import os

from gpuwarden.base.errors import UserError

TYPE_CHECKING = False  # typing stays off a client's start-up path (`run` through the service)
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any, Optional, TypeVar

    T = TypeVar("T")

MAX_PATH = 4096
MAX_BYTES = 1 << 60


class ProtocolError(UserError):
    """A malformed or refused request; the message is sent back as the error."""


def checked_string(value: object, name: str, limit: int = MAX_PATH, empty: bool = False) -> str:
    if not isinstance(value, str):
        raise ProtocolError(f"{name} must be a string")
    if "\0" in value:
        raise ProtocolError(f"{name} must not contain a NUL byte")
    if len(value) > limit:
        raise ProtocolError(f"{name} is longer than {limit} characters")
    if not empty and not value:
        raise ProtocolError(f"{name} must not be empty")
    return value


def checked_path(value: object, name: str) -> str:
    text = checked_string(value, name)
    if not os.path.isabs(text):
        raise ProtocolError(f"{name} must be an absolute path")
    return text


def checked_int(value: object, name: str, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ProtocolError(f"{name} must be an integer")
    if not low <= value <= high:
        raise ProtocolError(f"{name} must be between {low} and {high}")
    return value


def checked_number(
    value: object, name: str, low: float, high: float, open_low: bool = False
) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ProtocolError(f"{name} must be a finite number")
    if value < low or value > high or (open_low and value == low):
        raise ProtocolError(
            f"{name} must be {'above' if open_low else 'at least'} {low} and at most {high}"
        )
    return float(value)


def optional(value: object, check: Callable[..., T], *args: Any) -> Optional[T]:
    return None if value is None else check(value, *args)


def checked_strings(value: object, name: str, limit: int) -> tuple[str, ...]:
    if not isinstance(value, list):
        raise ProtocolError(f"{name} must be a list of strings")
    if len(value) > limit:
        raise ProtocolError(f"{name} has more than {limit} entries")
    return tuple(checked_string(v, f"{name} entry", empty=True) for v in value)


def checked_bool(value: object, name: str) -> bool:
    if not isinstance(value, bool):
        raise ProtocolError(f"{name} must be true or false")
    return value
