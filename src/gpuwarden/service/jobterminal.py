"""An attached job's own terminal, on the service's side (queueclient.terminal is the
client's): the pseudo-terminal the client passes becomes the controlling terminal of
the job's session, and the job's process group its foreground one, as `srun --pty`
sets a job up. Called in the forked supervisor and job, as root and as the owner."""

from __future__ import annotations

import contextlib
import os
import signal


def take(fd: int) -> None:
    """In the supervisor, a session leader: make the client's pseudo-terminal, which no
    session has yet (queueclient.terminal), the session's controlling terminal, so
    the job gets job control and window sizes as under `srun --pty`. The user's own
    terminal (passed where the client made none) belongs to the user's session: the
    kernel refuses it (EPERM, never taken from them), as it refuses a pipe (ENOTTY)."""
    import fcntl
    import termios

    with contextlib.suppress(OSError):
        fcntl.ioctl(fd, termios.TIOCSCTTY, 0)


def foreground(fd: int) -> None:
    """In the job, its own process group: the foreground one of its terminal, when that
    is its session's (`take`), so that its reads are not stopped (SIGTTIN)
    and Ctrl-C and Ctrl-Z reach it."""
    try:
        os.tcgetpgrp(fd)  # ENOTTY unless it is our session's terminal
    except OSError:
        return
    old = signal.signal(signal.SIGTTOU, signal.SIG_IGN)  # we are not in the foreground yet
    try:
        os.tcsetpgrp(fd, os.getpgrp())
    except OSError:
        pass
    finally:
        signal.signal(signal.SIGTTOU, old)
