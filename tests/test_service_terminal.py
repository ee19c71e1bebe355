"""`gpuwarden run -- bash -i` through the queue service, on a terminal, as `srun --pty`:
the job gets a terminal of its own, with job control (Ctrl-Z stops the foreground
command, `fg` resumes it, Ctrl-C interrupts it), and a window resized on the user's
terminal is resized in the job's. Driven through a real pseudo-terminal, as a real
user, against a real root service."""

from __future__ import annotations

import fcntl
import os
import pty
import select
import struct
import termios
import time

from hermetic import hermetic
from repo import SRC
from servicetools import USER_PY, Server
from users import make_user


class Screen:
    """The user's terminal: what was written to it, and keys typed into it."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.seen = b""

    def type(self, keys: bytes) -> None:
        os.write(self.fd, keys)

    def wait_for(self, text: bytes, timeout: float = 60) -> bytes:
        """Everything shown up to `text`'s first appearance after what was read before."""
        start = len(self.seen)
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
        return self.seen[start:]


def test_an_interactive_shell_gets_job_control_and_window_sizes(server: Server) -> None:
    alice = make_user("alice", ("lab",))
    env = {
        **hermetic(),
        "PATH": "/usr/bin:/bin",
        "PYTHONPATH": str(SRC),
        "GPUWARDEN_SOCKET": server.socket,
        "HOME": str(server.work),
        "TERM": "dumb",
        "PS1": "prompt$ ",
    }
    pid, fd = pty.fork()
    if pid == 0:  # the user's login on that terminal
        try:
            os.chdir(str(server.work))
            os.setgroups(list(alice.groups))
            os.setgid(alice.gid)
            os.setuid(alice.uid)
            argv = [USER_PY, "-m", "gpuwarden", "run", "-g", "1", "--", "bash", "--norc", "-i"]
            os.execve(USER_PY, argv, env)
        finally:
            os._exit(127)
    screen = Screen(fd)
    try:
        shown = screen.wait_for(b"prompt$ ")
        assert b"no job control" not in shown, shown
        screen.type(b"sleep 300\n")
        time.sleep(1)
        screen.type(b"\x1a")  # Ctrl-Z
        assert b"Stopped" in screen.wait_for(b"prompt$ ")
        screen.type(b"jobs\n")
        assert b"sleep 300" in screen.wait_for(b"prompt$ ")
        screen.type(b"fg\n")
        screen.wait_for(b"sleep 300")
        time.sleep(1)
        screen.type(b"\x03")  # Ctrl-C
        screen.wait_for(b"prompt$ ")
        screen.type(b"echo status=$?\n")
        assert b"status=130" in screen.wait_for(b"prompt$ ")
        fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", 33, 111, 0, 0))
        time.sleep(0.5)
        screen.type(b"stty size\n")
        screen.wait_for(b"33 111")  # the size reached the job's terminal
        screen.wait_for(b"prompt$ ")
        screen.type(b"tty; exit 7\n")
        screen.wait_for(b"/dev/pts/")
    finally:
        deadline = time.monotonic() + 60
        while True:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done or time.monotonic() > deadline:
                break
            try:
                if select.select([fd], [], [], 0.2)[0]:
                    screen.seen += os.read(fd, 65536)
            except OSError:
                time.sleep(0.1)
        if not done:
            os.kill(pid, 15)
            time.sleep(1)
            os.kill(pid, 9)
            os.waitpid(pid, 0)
        os.close(fd)
    assert done and os.waitstatus_to_exitcode(status) == 7, screen.seen[-2000:]
