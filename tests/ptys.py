"""A user's terminal in a test: a program started on a pseudo-terminal as a real user,
what it showed, keys typed into it, and the job control steps a shell on it is checked
with (tests/test_service_terminal.py, tests/test_lab_e2e.py)."""

from __future__ import annotations

import os
import pty
import select
import time
from collections.abc import Mapping, Sequence
from typing import Any, Optional

PROMPT = b"prompt$ "  # the PS1 the shells under test are given


class Screen:
    """The user's terminal: what was written to it, and keys typed into it."""

    def __init__(self, fd: int, pid: int = 0) -> None:
        self.fd = fd
        self.pid = pid  # the program on it (0: none of ours)
        self.seen = b""
        self.read_up_to = 0  # where the last text waited for ended

    def type(self, keys: bytes) -> None:
        os.write(self.fd, keys)

    def wait_for(self, text: bytes, timeout: float = 60) -> bytes:
        """Everything shown up to `text`'s first appearance after the text waited for
        before: one read may bring both, so the next wait starts where the last ended,
        not at the end of what was read."""
        start = self.read_up_to
        deadline = time.monotonic() + timeout
        while text not in self.seen[start:]:
            left = deadline - time.monotonic()
            assert left > 0, f"{text!r} not shown within {timeout:g} s; screen: {self.seen!r}"
            ready, _, _ = select.select([self.fd], [], [], min(left, 1.0))
            if ready:
                try:
                    chunk = os.read(self.fd, 65536)
                except OSError:
                    chunk = b""
                assert chunk, f"the terminal closed before {text!r}; screen: {self.seen!r}"
                self.seen += chunk
        self.read_up_to = self.seen.index(text, start) + len(text)
        return self.seen[start : self.read_up_to]

    def close(self, timeout: float = 60) -> Optional[int]:
        """The program's exit status once it ends (reading what it still shows); None
        when it had to be killed after `timeout` seconds."""
        deadline = time.monotonic() + timeout
        while True:
            done, status = os.waitpid(self.pid, os.WNOHANG)
            if done or time.monotonic() > deadline:
                break
            try:
                if select.select([self.fd], [], [], 0.2)[0]:
                    self.seen += os.read(self.fd, 65536)
            except OSError:
                time.sleep(0.1)
        if not done:
            os.kill(self.pid, 15)
            time.sleep(1)
            os.kill(self.pid, 9)
            os.waitpid(self.pid, 0)
        os.close(self.fd)
        return os.waitstatus_to_exitcode(status) if done else None


def login(who: Any, argv: Sequence[str], env: Mapping[str, str], cwd: str) -> Screen:
    """`argv` started as `who` (a tests/users.py person) on a terminal of its own."""
    pid, fd = pty.fork()
    if pid == 0:  # the user's login on that terminal
        try:
            os.chdir(cwd)
            os.setgroups(list(who.groups))
            os.setgid(who.gid)
            os.setuid(who.uid)
            os.execve(argv[0], list(argv), dict(env))
        finally:
            os._exit(127)
    return Screen(fd, pid)


def suspend_and_resume(screen: Screen) -> None:
    """In an interactive shell at its prompt: Ctrl-Z stops the foreground command, `fg`
    brings it back to the foreground, where Ctrl-C reaches it (status 130)."""
    shown = screen.wait_for(PROMPT)
    assert b"no job control" not in shown, shown
    screen.type(b"sleep 300\n")
    time.sleep(1)
    screen.type(b"\x1a")  # Ctrl-Z
    assert b"Stopped" in screen.wait_for(PROMPT)
    screen.type(b"jobs\n")
    assert b"sleep 300" in screen.wait_for(PROMPT)
    screen.type(b"fg\n")
    screen.wait_for(b"sleep 300")
    time.sleep(1)
    screen.type(b"\x03")  # Ctrl-C
    screen.wait_for(PROMPT)
    screen.type(b"echo status=$?\n")
    assert b"status=130" in screen.wait_for(PROMPT)
