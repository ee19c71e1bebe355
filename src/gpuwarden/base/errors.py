"""The one exception type that means "the user asked for something wrong".

Anything raised as `UserError` is printed by the CLI as a single line
(`gpuwarden: <message>`) with `exit_code`, never as a traceback. Library
callers get an ordinary exception they can catch.
"""

from __future__ import annotations


class UserError(Exception):
    """A bad request, input file or environment, explained in one line."""

    exit_code: int = 2

    def __init__(self, message: str, exit_code: int | None = None) -> None:
        super().__init__(message)
        if exit_code is not None:
            self.exit_code = exit_code
