"""How deep a JSON text nests, counted before it is parsed: the service refuses a
message nested deeper than `protocol.MAX_DEPTH` in one line, instead of letting the
parser recurse through `[` x 50,000 that a hostile client sent."""

from __future__ import annotations

TYPE_CHECKING = False  # typing is not imported at the CLI's start (tests/test_startup.py)
if TYPE_CHECKING:
    from typing import Any, Union

#: Levels a document from another host (`status --hosts`, a web peer) may nest: theirs
#: need five or six.
PEER_DEPTH = 64


class TooDeep(ValueError):
    """A JSON text nested deeper than its reader takes."""


def loads(text: Union[bytes, str], most: int = PEER_DEPTH) -> Any:
    """The JSON document `text` from a peer that may be hostile: nested deeper than
    `most` levels it is refused (TooDeep, a ValueError) before the parser recurses;
    malformed, a ValueError as json's."""
    import json

    raw = text.encode("utf-8", "surrogatepass") if isinstance(text, str) else text
    depth = nesting(raw, most)
    if depth > most:
        raise TooDeep(f"nested deeper than {most} levels")
    try:
        return json.loads(raw)
    except RecursionError:  # the parser's own limit, below ours
        raise TooDeep(f"nested too deep ({depth} levels)") from None


def nesting(line: bytes, most: int) -> int:
    """How deep brackets nest in a JSON text, strings skipped: counted before parsing, so
    that `[` x 50,000 is refused in one line instead of recursing in the parser. Scans
    only the structural bytes (`bytes.translate` keeps brackets, quotes and
    backslashes), so a 1 MiB message costs about a millisecond. Past `most` levels the
    count stops: the message is refused whatever its full depth."""
    kept = line.translate(None, _NOT_STRUCTURAL)
    if b"[" not in kept and b"{" not in kept:
        return 0
    depth = deepest = 0
    inside = escaped = False
    for byte in kept:
        if inside:
            if escaped:
                escaped = False
            elif byte == 0x5C:  # backslash
                escaped = True
            elif byte == 0x22:
                inside = False
        elif byte == 0x22:
            inside = True
        elif byte in (0x5B, 0x7B):
            depth += 1
            if depth > deepest:
                deepest = depth
                if deepest > most:
                    return deepest
        elif byte in (0x5D, 0x7D):
            depth -= 1
    return deepest


_NOT_STRUCTURAL = bytes(b for b in range(256) if b not in b'[]{}"\\')
