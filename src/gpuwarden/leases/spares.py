"""Lease record files made ahead, for a long-lived process that takes leases often.

Taking a lease creates its record under a temporary name (`Held.take`), and creating a
file waits for the file system's journal: on a busy disk that is 0.1-1.5 ms, on the way
from a freed GPU to its next job. The queue service makes a few of those files after a
turn's starts have their go-ahead (`stock`), each empty, locked, under a temporary name
(`.spare.lease.<pid>-<random>.tmp`: readers skip it, `leases.sweep` leaves it while it is
locked and removes it once old and unlocked, after a crash); a take uses one (`take`),
and the record is written and renamed into place as before, so no reader ever sees half
of it. They belong to one judgement of the directory (one `LeaseDir`): when it is judged
again they are removed, never used in a directory that may be another one now.
"""

from __future__ import annotations

import contextlib
import fcntl
import os

from gpuwarden.files.safefiles import temporary_name
from gpuwarden.leases.dir import LeaseDir
from gpuwarden.leases.record import HOLDER_SUFFIX

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Optional

#: Most files kept ready: a machine's GPUs' worth, up to this.
MOST = 16
FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


class Spares:
    """Record files made ahead in one lease directory (as judged: `dir`)."""

    def __init__(self) -> None:
        self.dir: Optional[LeaseDir] = None
        self.files: list[tuple[int, str]] = []  # (descriptor, locked; its path)
        self.made = 0  # files made (stats)
        self.missed = False  # a take found none for its directory since the last stock

    def take(self, ld: LeaseDir) -> Optional[tuple[int, str]]:
        """A file made ahead in `ld` (as judged now), or None: the caller makes one."""
        if self.dir is not ld or not self.files:
            self.missed = True
            return None
        return self.files.pop()

    def short(self, count: int) -> bool:
        """Whether `stock` has work: fewer than `count` ready, or a take missed."""
        return self.missed or len(self.files) < min(count, MOST)

    def stock(self, ld: LeaseDir, count: int) -> None:
        """Have `count` files ready in `ld` (at most MOST); those of an earlier judgement
        of the directory removed. OSError where one cannot be made (a full disk: the
        next take makes its own and says so)."""
        if self.dir is not ld:
            self.clear()
            self.dir = ld
        self.missed = False
        while len(self.files) < min(count, MOST):
            path = temporary_name(ld.join("spare" + HOLDER_SUFFIX))
            fd = os.open(path, FLAGS, 0o644)
            fcntl.flock(fd, fcntl.LOCK_EX)
            self.files.append((fd, path))
            self.made += 1

    def clear(self) -> None:
        """Remove every file made ahead (the service stops, or the directory changed)."""
        for fd, path in self.files:
            with contextlib.suppress(OSError):
                os.unlink(path)
            os.close(fd)
        self.files = []
        self.dir = None
