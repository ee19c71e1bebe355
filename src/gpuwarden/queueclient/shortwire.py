"""The protocol's lines for the short clients, by the interpreter's built-in modules.

The short `submit` and `queue` (queueclient.thin, queueclient.thinqueue) exist to
cost the interpreter's start and little more, so they speak the protocol of
queueclient.protocol (one compact JSON object per line) without the json package
(which imports `re`) or the socket module (`enum`, `selectors`): `_json`'s encoder
and scanner are the very ones `json` drives, with json's defaults.
"""

import sys

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

TIMEOUT = 30.0  # as queueclient.client.connect's
NOTICE_AFTER = 3.0


def encoded(message: "dict[str, Any]") -> bytes:
    """One line of the protocol (queueclient.protocol.encode's compact JSON), by the
    interpreter's own JSON encoder, without the json package (and its `re`)."""
    import _json

    def unknown(value: object) -> object:
        raise TypeError(f"{type(value).__name__} is not JSON")

    encode = _json.make_encoder(
        None, unknown, _json.encode_basestring_ascii, None, ":", ",", False, False, False
    )
    return "".join(encode(message, 0)).encode("ascii") + b"\n"


class _Reading:
    """What the interpreter's JSON scanner asks of its decoder: json.loads' defaults."""

    strict = True
    object_hook = None
    object_pairs_hook = None
    parse_float = float
    parse_int = int

    @staticmethod
    def parse_constant(name: str) -> object:
        raise ValueError(f"{name} is not JSON")


def decoded(line: bytes) -> "dict[str, Any]":
    import _json

    scanner: Any = _json.make_scanner  # typeshed wants a scanner as its context
    value, _ = scanner(_Reading)(line.decode("utf-8"), 0)
    return value if isinstance(value, dict) else {}


def answer(sock: "Any", path: str) -> bytes:
    """The answer's line; after NOTICE_AFTER seconds of silence the user is told once,
    as by the full client (queueclient.client.Client._recv)."""
    data = b""
    sock.settimeout(NOTICE_AFTER)
    told = False
    while not data.endswith(b"\n"):
        try:
            more = sock.recv(65536)
        except TimeoutError:
            if told:
                raise
            told = True
            sys.stderr.write(
                f"gpuwarden: the service at {path} has not answered for "
                f"{NOTICE_AFTER:g}s; waiting up to {TIMEOUT:g}s\n"
            )
            sys.stderr.flush()
            sock.settimeout(TIMEOUT - NOTICE_AFTER)
            continue
        if not more:
            return b""
        data += more
    return data
