"""The drains and the XIDs in force, as a long-running service's passes and starts
see them: read again only when a file they come from may have changed.

`list_drains` lists the state directory and reads every drain record; `xids_seen`
opens and reads the XID logs and /proc/stat. The queue service needed both for
every pass and again for every start, twice a job for files that change a few
times a year. What they come from is few files: the state directory (a drain
added or removed, an owner or a mode changed: its lstat), each drain record read
and each XID log believed (their stat: an append, a rewrite, a replacement). While
all of those stat the same, the last reading stands; a file changed within
`SETTLED` seconds is read again each time, since a second change within its
timestamp's granularity would not show. A file swapped for another, a record
rewritten in place: each changes what the stat shows, and the next use reads.
"""

from __future__ import annotations

import os
import time
from typing import TYPE_CHECKING, Any, Optional

if TYPE_CHECKING:
    from gpuwarden.health.drain import Drain

    Stamp = tuple[Optional[tuple[int, ...]], ...]

#: A file changed this recently may change again unseen within its timestamp's
#: granularity: what is read then is not kept.
SETTLED = 2.0


class HealthFiles:
    """The drains and XIDs in force in one state directory, kept while unchanged."""

    def __init__(self, settled: float = SETTLED) -> None:
        self._settled = settled
        self._state = ""
        self._paths: tuple[str, ...] = ()  # the files the reading came from
        self._stamp: Optional[Stamp] = None
        self._kept: Optional[tuple[dict[str, Drain], dict[str, tuple[int, ...]]]] = None
        self._boot: Optional[float] = None  # fixed while the machine runs
        self._rules: tuple[Any, Any] = (None, None)  # (reading, its health rules)
        self.reads = 0

    def current(self, state: str) -> tuple[dict[str, Drain], dict[str, tuple[int, ...]]]:
        """(drains by UUID, XIDs in force by UUID) in the state directory `state`."""
        kept = self._kept
        if kept is not None and state == self._state and _stamp(state, self._paths) == self._stamp:
            return kept
        from gpuwarden.health import drain, xidlog

        if self._boot is None:
            self._boot = xidlog.boot_time()
        logs = tuple(path for path, _ in xidlog.trusted_logs(state))
        before = _stamp(state, logs)  # taken first: a change meanwhile is read next time
        drains = drain.list_drains(state)
        xids = xidlog.xids_seen(self._boot, state=state)
        self.reads += 1
        records = tuple(os.path.join(state, f"{drain.PREFIX}{u}{drain.SUFFIX}") for u in drains)
        paths = logs + records
        stamp = None if before is None else before + _stamp_files(records)
        self._state, self._paths = state, paths
        self._stamp = stamp if stamp is not None and _settled(stamp, self._settled) else None
        self._kept = (drains, xids) if self._stamp is not None else None
        return drains, xids

    def judged(self, gpus: Any, conf: Any) -> dict[str, tuple[Any, ...]]:
        """`xidlog.judged(gpus, conf=conf)`, with the XIDs kept here: the symptoms per UUID
        (the health rules kept for the reading `conf`, the service's while unchanged)."""
        from gpuwarden.files.locations import state_location
        from gpuwarden.health.judgement import judge_all, rules_in_force

        if conf is None or self._rules[0] is not conf:  # a reading's rules, worked out once
            self._rules = (conf, rules_in_force(conf))
        return judge_all(gpus, self.current(state_location(conf))[1], self._rules[1])


def _stamp(state: str, paths: tuple[str, ...]) -> Optional[Stamp]:
    """The state directory's lstat and each of `paths`' (None where missing); None when
    the directory cannot be looked at."""
    try:
        st = os.lstat(state)
    except OSError:
        return None
    head = (st.st_dev, st.st_ino, st.st_mode, st.st_uid, st.st_mtime_ns, st.st_ctime_ns)
    return (head, *_stamp_files(paths))


def _stamp_files(paths: tuple[str, ...]) -> Stamp:
    stamps: list[Optional[tuple[int, ...]]] = []
    for path in paths:
        try:
            st = os.lstat(path)
        except OSError:
            stamps.append(None)
            continue
        stamps.append(
            (
                st.st_dev,
                st.st_ino,
                st.st_mode,
                st.st_uid,
                st.st_size,
                st.st_mtime_ns,
                st.st_ctime_ns,
            )
        )
    return tuple(stamps)


def _settled(stamp: Stamp, seconds: float) -> bool:
    """Whether every file in `stamp` last changed more than `seconds` ago."""
    settled = time.time_ns() - int(seconds * 1e9)
    return all(s is None or (s[-1] < settled and s[-2] < settled) for s in stamp)
