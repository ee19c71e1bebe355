"""How deep a JSON text nests, counted before it is parsed: the service refuses a
message nested deeper than `protocol.MAX_DEPTH` in one line, instead of letting the
parser recurse through `[` x 50,000 that a hostile client sent."""

from __future__ import annotations


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
