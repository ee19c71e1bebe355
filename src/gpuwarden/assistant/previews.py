"""A submit seen before it is sent: the preview's token, and the one rule it enforces.

An assistant may call `submit` on its own; the user should see what would be queued
first. The first call of a request returns its preview and a token; only a second
call of the same request with that token sends it. A token is an HMAC of the
request under a key made when the server starts, so it names exactly one request
(another command, GPU count or folder needs its own preview); it is good once, for
`TTL` seconds, and only in the server that issued it.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import secrets
import time
from collections.abc import Callable, Mapping
from typing import Any, Optional

from gpuwarden.base.errors import UserError

#: Seconds a preview's token may be used.
TTL = 600.0


class Previews:
    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._key = secrets.token_bytes(32)
        self._issued: dict[str, float] = {}
        self._clock = clock

    def token(self, request: Mapping[str, Any]) -> str:
        """The token of `request`, remembered as issued now."""
        token = self._sign(request)
        self._forget_old()
        self._issued[token] = self._clock()
        return token

    def redeem(self, request: Mapping[str, Any], token: Optional[str]) -> None:
        """Accept `token` for `request` once, or raise UserError saying why not."""
        self._forget_old()
        if not token:
            raise UserError("a submit needs its preview's token: call submit without one first")
        if not hmac.compare_digest(self._sign(request), token):
            raise UserError(
                "refused: this token is not the preview of this request (another command, "
                "option or folder, or another server's token); ask for a new preview"
            )
        if token not in self._issued:
            raise UserError(
                f"refused: this preview's token was used already or is over {TTL:g}s old; "
                "ask for a new preview"
            )
        del self._issued[token]

    def _sign(self, request: Mapping[str, Any]) -> str:
        body = json.dumps(request, sort_keys=True, separators=(",", ":")).encode()
        return hmac.new(self._key, body, hashlib.sha256).hexdigest()[:32]

    def _forget_old(self) -> None:
        now = self._clock()
        for token in [t for t, at in self._issued.items() if now - at > TTL]:
            del self._issued[token]
