"""`gpuwarden run -- bash -i` through the queue service, on a terminal, as `srun --pty`:
the job gets a terminal of its own, with job control (Ctrl-Z stops the foreground
command, `fg` resumes it, Ctrl-C interrupts it), and a window resized on the user's
terminal is resized in the job's. Driven through a real pseudo-terminal, as a real
user, against a real root service."""

from __future__ import annotations

import fcntl
import struct
import termios
import time

from hermetic import hermetic
from ptys import PROMPT, login, suspend_and_resume
from repo import SRC
from servicetools import USER_PY, Server
from users import make_user


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
    argv = [USER_PY, "-m", "gpuwarden", "run", "-g", "1", "--", "bash", "--norc", "-i"]
    screen = login(alice, argv, env, str(server.work))
    try:
        suspend_and_resume(screen)
        fcntl.ioctl(screen.fd, termios.TIOCSWINSZ, struct.pack("HHHH", 33, 111, 0, 0))
        time.sleep(0.5)
        screen.type(b"stty size\n")
        screen.wait_for(b"33 111")  # the size reached the job's terminal
        screen.wait_for(PROMPT)
        screen.type(b"tty; exit 7\n")
        screen.wait_for(b"/dev/pts/")
    finally:
        status = screen.close()
    assert status == 7, screen.seen[-2000:]
