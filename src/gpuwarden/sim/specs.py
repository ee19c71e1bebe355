"""Machine specs: TOML files that describe a simulated machine, found and loaded.

A spec names each GPU's card model (whose real figures come from `cards.CARDS`)
plus what is going on: temperatures, load, other users' processes, faults. This
module finds a spec by name or path and loads it, from a cache of its parsed form
when it can; `specparse` reads and validates the TOML on a miss, and `specdata`
holds the parsed form (`Spec`) both share.

Every NVML client of a simulated machine loads its spec at start, so paths here
are `os.path` strings: `pathlib` (with the `urllib.parse` it imports) is
imported only to spell a user's path as the spec's identity or when a spec is
parsed.
"""

from __future__ import annotations

import json
import os

from gpuwarden.base.errors import UserError
from gpuwarden.sim import cards, specdata
from gpuwarden.sim.specdata import Spec

TYPE_CHECKING = False  # typing stays off the start-up path; annotations need it only here
if TYPE_CHECKING:
    from typing import Optional

SPEC_DIR = os.path.join(os.path.dirname(os.path.realpath(__file__)), "specs")
# The parsing code, named without importing it: its identity is part of the cache key.
_SPECPARSE = os.path.join(os.path.dirname(__file__), "specparse.py")


def bundled() -> list[str]:
    return sorted(n[: -len(".toml")] for n in os.listdir(SPEC_DIR) if n.endswith(".toml"))


def spec_path(spec: str) -> str:
    """The TOML file for a bundled name or a path; unknown names list the bundled ones."""
    if spec.endswith(".toml") or os.sep in spec:
        from pathlib import Path  # its spelling of the path is the spec's identity

        path = str(Path(spec).expanduser())
        if not os.path.isfile(path):
            exists = os.path.exists(path)
            raise UserError(
                f"spec file {spec} {'is not a regular file' if exists else 'not found'}"
            )
        return path
    path = os.path.join(SPEC_DIR, f"{spec}.toml")
    if not os.path.isfile(path):
        raise UserError(
            f"unknown spec {spec!r}; bundled specs: {', '.join(bundled())} "
            "(or give the path of a .toml file)"
        )
    return path


def state_file(spec: Spec, state_dir: Optional[str] = None) -> str:
    """Where the machine's mutable state lives: one JSON file per spec in the state dir."""
    return os.path.join(_state_base(state_dir), f"{_stem(spec.name, spec.path)}.json")


def _state_base(state_dir: Optional[str]) -> str:
    base = state_dir or os.environ.get("GPUWARDEN_SIM_STATE")
    if not base:
        import tempfile

        base = os.path.join(tempfile.gettempdir(), f"gpuwarden-sim-{os.getuid()}")
    return base


def _stem(name: str, path: str) -> str:
    """A bundled spec is known by its name; any other file also by a digest of its path,
    so two `my.toml` in different directories are two machines."""
    if os.path.dirname(path) == SPEC_DIR:
        return name
    from pathlib import Path

    if Path(path).parent == Path(SPEC_DIR):  # the same directory, spelt differently
        return name
    import hashlib

    digest = hashlib.sha1(str(Path(path).resolve()).encode()).hexdigest()[:8]
    return f"{name}-{digest}"


def _name_of(path: str) -> str:
    """The file name without its suffix, as `Path.stem` had it before Python 3.14 (which
    takes a trailing dot for a suffix): the same name on every Python."""
    name = os.path.basename(path)
    dot = name.rfind(".")
    return name[:dot] if 0 < dot < len(name) - 1 else name


_CACHE: dict[str, Spec] = {}
_MAX_SPEC_BYTES = 4 << 20  # a spec is a few KiB; more is a wrong file, not a machine

# Bump when the parsed form changes in a way file identities would not show.
_PARSED_FORMAT = 1


def load(spec: str, state_dir: Optional[str] = None) -> Spec:
    """The parsed spec for a bundled name or a path, once per process.

    Every NVML client on a simulated machine (status, run, nvitop through the
    shim) starts by loading its spec, and parsing costs more than the rest of
    the fake's set-up (tomllib, uuid and hashlib imports, validation).
    So the parsed form is also kept as JSON beside the machine's state file,
    keyed by the identity (path, mtime, size) of the spec and of the code that
    parses it; any change to one of them means a fresh parse."""
    path = spec_path(spec)
    if path not in _CACHE:
        _CACHE[path] = _load_parsed(path, state_dir)
    return _CACHE[path]


def _identity(path: str) -> list[int]:
    st = os.stat(path)
    return [st.st_mtime_ns, st.st_size]


def _parse_file(path: str) -> Spec:
    try:
        with open(path, "rb") as handle:
            data = handle.read(_MAX_SPEC_BYTES + 1)
    except OSError as err:
        raise UserError(f"spec {path}: cannot read: {err.strerror}") from None
    if len(data) > _MAX_SPEC_BYTES:
        raise UserError(f"spec {path}: too large for a spec (over {_MAX_SPEC_BYTES} bytes)")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as err:
        line = data[: err.start].count(b"\n") + 1
        raise UserError(
            f"spec {path}:{line}: not UTF-8 text (byte 0x{data[err.start]:02x})"
        ) from None
    from gpuwarden.sim.specparse import parse

    return parse(text, path)


def _load_parsed(path: str, state_dir: Optional[str]) -> Spec:
    try:
        key = [_PARSED_FORMAT, path, *_identity(path)]
        key += [*_identity(__file__), *_identity(_SPECPARSE), *_identity(specdata.__file__)]
        key += _identity(cards.__file__)
        cache = os.path.join(_state_base(state_dir), f".{_stem(_name_of(path), path)}.spec.json")
    except OSError:
        return _parse_file(path)
    from gpuwarden.files.safefiles import UnsafeFile, read_small

    try:
        # The cache sits in the state directory (by default a name in /tmp anyone
        # could take first): only a regular file of our own is believed; a FIFO, a
        # symlink, a huge file or another user's file is parsed around, never read.
        raw, st = read_small(cache, 4 * _MAX_SPEC_BYTES, what="spec cache")
        if st.st_uid != os.geteuid():
            raise ValueError("not ours")
        saved = json.loads(raw)
        if saved["key"] == key:
            fields = saved["spec"]
            fields["gpus"] = tuple(fields["gpus"])
            fields["processes"] = tuple(fields["processes"])
            return Spec(**fields)
    except (UnsafeFile, OSError, ValueError, KeyError, TypeError, AttributeError, RecursionError):
        pass
    parsed = _parse_file(path)
    try:  # a state dir we may not write is fine: the next load parses again
        from gpuwarden.files.safefiles import write_atomic

        os.makedirs(os.path.dirname(cache), exist_ok=True)
        data = json.dumps({"key": key, "spec": vars(parsed)})
        write_atomic(cache, data, what="spec cache", durable=False)
    except (OSError, UserError):
        pass
    return parsed
