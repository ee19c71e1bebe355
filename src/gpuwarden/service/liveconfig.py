"""The configuration the service plans by between reloads, read again only when it changes.

What changes without a reload (where drains and XID logs are, the health rules) is
taken from a reading of the configuration on every pass of the plan and judged on
every submit. Reading it (a walk for the project file, a TOML parse per file, every
key's variables) cost more than the rest of a start pass, for a file that changes a
few times a year. So `LiveConfig.current` reads it again only when what the reading
depends on differs from the last time:

- which files it names (the system file from `GPUWARDEN_SYSTEM_CONFIG`, the user
  file from `XDG_CONFIG_HOME`/`HOME`, the nearest project file from the working
  directory: the walk is redone, a few `lstat` calls) and the settings' variables;
- each file's `lstat` and `stat` (inode, size, mtime, ctime, mode, owner) and its
  directories' mode and owner (`config.trust` judges them), so an edit, a replacement, a `chmod`
  or a new link is seen at the next pass, as before.

A file written within `RACY` seconds of the check could change again within the
same timestamp, same size and inode (an in-place rewrite): it is read on every pass
until it is older, as git treats a "racily clean" file. A reading that fails (a
broken file) is not kept: the next pass reads again and says why again.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Optional

from gpuwarden.config.keys import SCHEMA
from gpuwarden.files.configfiles import project_config, system_config, user_config

if TYPE_CHECKING:
    from gpuwarden.config import Config

RACY = 2.0  # seconds: a coarse or second-granular mtime cannot tell two writes apart
# The variables a reading depends on: every key's, and those that place the files.
NAMES = frozenset(
    (
        "GPUWARDEN_SYSTEM_CONFIG",
        "XDG_CONFIG_HOME",
        "HOME",
        *(n for k in SCHEMA for n in k.env_names),
    )
)


def _load() -> Config:
    from gpuwarden import config

    return config.load()


def _stat(path: str, follow: bool = True) -> Optional[tuple[int, ...]]:
    try:
        st = os.stat(path) if follow else os.lstat(path)
    except OSError:
        return None
    return (
        st.st_mode,
        st.st_uid,
        st.st_gid,
        st.st_mtime_ns,
        st.st_ino,
        st.st_dev,
        st.st_size,
        st.st_ctime_ns,
    )


def _folder(path: str) -> Optional[tuple[int, ...]]:
    """What trust sees of a directory: its kind, mode and owner (its times move with
    every file made in it)."""
    seen = _stat(path)
    return None if seen is None else seen[:3]


def _file(path: Optional[str]) -> Any:
    """What a reading of `path` depends on: the file's own stat and, where it is there,
    its target's and both directories' (as `config.trust.refusal` judges them)."""
    if path is None:
        return None
    own = _stat(path, follow=False)
    if own is None:
        return (path, None)
    real = os.path.realpath(path)
    folders = {os.path.dirname(os.path.abspath(path)), os.path.dirname(real)}
    return (path, own, real, _stat(path), *((d, _folder(d)) for d in sorted(folders)))


class LiveConfig:
    """The service's reading of the configuration, kept while its files stay as read."""

    def __init__(self, load: Callable[[], Config] = _load) -> None:
        self._load = load
        self._kept: Optional[Config] = None
        self._seen: Any = None  # what the kept reading depended on (`_signature`)
        self.reads = 0  # readings made
        self.checks = 0  # readings asked for
        self._environ: Optional[dict[bytes, bytes]] = None  # the environment as last named
        self._named: tuple[tuple[str, str], ...] = ()  # and its variables that matter

    def stats(self) -> dict[str, int]:
        return {"reads": self.reads, "checks": self.checks}

    def current(self) -> Config:
        """The configuration now: the kept reading while nothing it depends on changed,
        else a new one (UserError, as `config.load`'s, where it is refused)."""
        self.checks += 1
        seen, racy = self._signature(self._variables())
        if self._kept is not None and seen == self._seen and not racy:
            return self._kept
        self._kept, self._seen = None, None
        reading = self._load()
        self.reads += 1
        self._kept, self._seen = reading, seen
        return reading

    def forget(self) -> None:
        """Read again at the next `current` (a reload asked for it)."""
        self._kept = self._seen = None

    def _variables(self) -> tuple[tuple[str, str], ...]:
        """The variables of NAMES that are set, with their values. Filtered again only
        when the environment changed: os.environ's own table (its bytes, as the C
        library has them) compared whole costs a microsecond, decoding every entry
        through the mapping each pass ~30 (and a name not set, looked up, a KeyError)."""
        env = os.environ
        table = getattr(env, "_data", None)
        if not isinstance(table, dict):  # not CPython's: filtered every time
            return tuple(kv for kv in env.items() if kv[0] in NAMES)
        if table != self._environ:
            self._named = tuple(kv for kv in env.items() if kv[0] in NAMES)
            self._environ = dict(table)
        return self._named

    @staticmethod
    def _signature(named: tuple[tuple[str, str], ...] = ()) -> tuple[Any, bool]:
        env = os.environ
        files = tuple(
            _file(p) for p in (system_config(env), user_config(env), project_config(None))
        )
        stats = (s for f in files if f is not None and f[1] is not None for s in (f[1], f[3]))
        newest = max((s[3] for s in stats if s is not None), default=0)  # mtime
        racy = time.time_ns() - newest < RACY * 1e9
        return (named, os.getcwd(), files), racy
