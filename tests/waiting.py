"""The suite's one way to wait for something that happens in another process or thread.

A test never sleeps and hopes: it polls a condition with a bound, and when the bound
passes it fails saying what it waited for and what it last saw, so a slow CI machine
gives a readable failure rather than a hang or a bare `assert False`.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")

EVERY = 0.05  # seconds between polls: short enough not to slow a test, long enough not to spin


def wait_for(
    condition: Callable[[], T],
    timeout: float,
    what: str | Callable[[], str],
    every: float = EVERY,
) -> T:
    """`condition()`'s first truthy value, polled until `timeout` seconds have passed.

    A condition may itself assert (say, that the process it waits on is still alive):
    that failure comes through at once instead of waiting out the bound. `what` may be a
    callable, asked only on failure, when the useful words are known only then (a job's
    last state, a log's tail).
    """
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        left = deadline - time.monotonic()
        if left <= 0:
            said = what() if callable(what) else what
            raise AssertionError(f"{said}: not within {timeout:g} s (last seen: {value!r})")
        time.sleep(min(every, left))
