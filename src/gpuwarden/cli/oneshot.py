"""For commands that read once, print and exit: no cyclic garbage collection.

Such a process builds its modules and one reading, all alive until it exits.
The cyclic collector would walk them dozens of times during the run and every
object once more at interpreter exit, freeing nothing: for `gpuwarden status`
that was an eighth of its CPU time (docs/performance.md). Inside `one_shot()`
the collector is paused; at its end what is alive is frozen (never walked
again, also not at exit) and the collector is switched back on for whatever
follows. Not for loops (`--watch`): their garbage must still be collected.

`gpuwarden run` pauses it the same way while it sets up (imports, config,
the reading, the lease) and gives it back when the job starts, or as soon as
it has to wait in line: a wait may last hours and its loop makes garbage.
"""

from __future__ import annotations

import gc

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable


class one_shot:
    """`with one_shot() as resume:` gives `resume`, which ends the pause early (calling
    it again is harmless). A class, not `contextlib.contextmanager`: contextlib would be
    one more module to import before every job starts."""

    def __enter__(self) -> Callable[[], None]:
        self._was_enabled = gc.isenabled()
        gc.disable()
        return self.resume

    def resume(self) -> None:
        gc.freeze()
        if self._was_enabled:
            gc.enable()

    def __exit__(self, *exc: object) -> None:
        self.resume()
