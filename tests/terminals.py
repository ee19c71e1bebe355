"""A real terminal for tests of full-screen commands: tmux, typed into and read back.

`Tmux(folder, command, width, height)` starts a tmux server of its own (a socket in
`folder`, no config file) with one window of that size running `command`; `keys`
types as a person would (one key at a time), `screen` reads the window's lines,
`wait` waits until they show something, `tmux` runs any other tmux command
(`resize-window`), and `close` ends it all.
"""

from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

from components import require
from waiting import wait_for


class Tmux:
    """A tmux server of its own (its own socket) with one window running a command."""

    def __init__(self, folder: Path, command: list[str], width: int, height: int) -> None:
        require(shutil.which("tmux") is not None, "tmux is not installed (apt-get install tmux)")
        self.socket = str(folder / "tmux.sock")
        self.tmux("new-session", "-d", "-s", "top", "-x", str(width), "-y", str(height), *command)
        self.tmux("set-option", "-t", "top", "remain-on-exit", "on")

    def tmux(self, *args: str) -> str:
        done = subprocess.run(
            ["tmux", "-S", self.socket, "-f", "/dev/null", *args],
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert done.returncode == 0, f"tmux {args[0]}: {done.stderr}"
        return done.stdout

    def screen(self) -> list[str]:
        return self.tmux("capture-pane", "-p", "-t", "top").split("\n")

    def keys(self, *keys: str) -> None:
        for key in keys:
            self.tmux("send-keys", "-t", "top", key)
            time.sleep(0.05)  # as typed: each key read before the next

    def wait(self, what: str, found: Any, timeout: float = 30) -> list[str]:
        """The screen once `found(lines)` holds; failing, the screen as it was."""
        last: list[str] = []

        def check() -> Any:
            last[:] = self.screen()
            return last if found(last) else None

        return wait_for(check, timeout, lambda: f"{what}; the screen:\n" + "\n".join(last))

    def close(self) -> None:
        subprocess.run(["tmux", "-S", self.socket, "kill-server"], capture_output=True, timeout=30)
