"""A terminal of its own for an attached job on a terminal, as `srun --pty` gives one.

The service starts an attached job in a session of its own, so a job given the user's
terminal itself is in none of that terminal's process groups: a shell there has no job
control (no Ctrl-Z, no `fg`) and never hears of a window resized. When `run` is on a
terminal, it instead makes a pseudo-terminal (as the user, so its other end is the
user's), passes that end to the service as the job's stdin, stdout and stderr, and
relays between it and the real terminal, which it puts in raw mode: Ctrl-C, Ctrl-Z and
every other key reach the job's terminal, whose line discipline signals the job's
foreground process group; a window resized here (SIGWINCH) is resized there. The
service makes the pseudo-terminal the job's controlling terminal (service.spawn).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import select
import signal
import sys
import termios
import threading
from typing import Any, Optional


class Terminal:
    """The job's pseudo-terminal and the relay between it and ours (fd 0 and 1)."""

    def __init__(self) -> None:
        self.master, slave = os.openpty()
        os.set_inheritable(self.master, False)
        self.slave: Optional[int] = slave
        self._saved: Optional[list[Any]] = None
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self._previous: Any = None
        self.resize()

    @classmethod
    def wanted(cls) -> Optional[Terminal]:
        """One where stdin and stdout are a terminal (and not disabled by
        GPUWARDEN_PTY=0); None elsewhere (pipes, files, a batch), or where no
        pseudo-terminal can be had. The caller asks first (client.run_attached), so
        that a job off a terminal imports none of this."""
        try:
            return cls()
        except OSError:
            return None

    @property
    def fds(self) -> tuple[int, int, int]:
        """What the service gets as the job's stdin, stdout and stderr."""
        assert self.slave is not None
        return (self.slave, self.slave, self.slave)

    def resize(self, *_: object) -> None:
        """Our window's size onto the job's terminal (which signals SIGWINCH there)."""
        with contextlib.suppress(OSError):
            size = fcntl.ioctl(1, termios.TIOCGWINSZ, b"\0" * 8)
            fcntl.ioctl(self.master, termios.TIOCSWINSZ, size)

    def start(self) -> None:
        """The job runs: our terminal in raw mode, the relay on, the window followed."""
        if self._thread is not None:
            return
        with contextlib.suppress(termios.error):
            self._saved = termios.tcgetattr(0)
            mode = termios.tcgetattr(0)
            # cfmakeraw, as `tty.setraw` does (tty imports more than this needs)
            mode[0] &= ~(
                termios.IGNBRK
                | termios.BRKINT
                | termios.PARMRK
                | termios.ISTRIP
                | termios.INLCR
                | termios.IGNCR
                | termios.ICRNL
                | termios.IXON
            )
            mode[1] &= ~termios.OPOST
            mode[2] &= ~(termios.CSIZE | termios.PARENB)
            mode[2] |= termios.CS8
            mode[3] &= ~(
                termios.ECHO | termios.ECHONL | termios.ICANON | termios.ISIG | termios.IEXTEN
            )
            mode[6][termios.VMIN] = 1
            mode[6][termios.VTIME] = 0
            termios.tcsetattr(0, termios.TCSAFLUSH, mode)
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGWINCH, self.resize)
        self.resize()
        self._thread = threading.Thread(target=self._relay, name="gpuwarden-pty", daemon=True)
        self._thread.start()

    def _relay(self) -> None:
        reading = [0, self.master]
        while not self._stop.is_set():
            try:
                ready, _, _ = select.select(reading, [], [], 0.1)
            except OSError:
                return
            for fd in ready:
                try:
                    data = os.read(fd, 65536)
                except OSError as err:
                    if err.errno == errno.EIO and fd == self.master:
                        return  # every holder of the job's end closed it
                    data = b""
                if not data:
                    if fd == self.master:
                        return
                    reading.remove(0)  # our input ended: the job's stays open
                    continue
                _write_all(self.master if fd == 0 else 1, data)

    def close(self) -> None:
        """The job ended: what it wrote last is shown, our terminal is as it was."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(2.0)
        self.release_slave()
        with contextlib.suppress(OSError):
            os.set_blocking(self.master, False)
            while data := os.read(self.master, 65536):
                _write_all(1, data)
        os.close(self.master)
        if self._saved is not None:
            with contextlib.suppress(termios.error):
                termios.tcsetattr(0, termios.TCSAFLUSH, self._saved)
        if self._previous is not None:
            signal.signal(signal.SIGWINCH, self._previous)
        sys.stdout.flush()

    def release_slave(self) -> None:
        """Our copy of the job's end, once the job has its own."""
        if self.slave is not None:
            os.close(self.slave)
            self.slave = None


def _write_all(fd: int, data: bytes) -> None:
    while data:
        try:
            data = data[os.write(fd, data) :]
        except BlockingIOError:
            select.select([], [fd], [], 1.0)
        except OSError:
            return
