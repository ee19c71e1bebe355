"""Telling people about an event: a hook command and a webhook, off the caller's thread.

The health watch notifies each new GPU finding this way, and the queue service's
notification sender posts its job events through it. A worker thread runs the hook
(the event as JSON on stdin and as GPUWARDEN_* variables) and posts the webhook
(JSON), each with a timeout, from a bounded queue: a hung hook or webhook delays
other notifications but never the caller, and a full queue drops an event with a line.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import subprocess
import threading
from collections.abc import Callable, Sequence
from typing import Any, Optional


def warn(message: str) -> None:
    """One line on the `gpuwarden.health` log, where the notifier and the health watch
    say what went wrong. Through logging: the CLI sets its format and level once
    (--log-level)."""
    import logging

    logging.getLogger("gpuwarden.health").warning(message)


class Notifier:
    """Runs the hook and posts the webhook for each event, off the caller's thread."""

    def __init__(
        self,
        hook: Optional[Sequence[str]] = None,
        webhook: Optional[str] = None,
        *,
        webhook_timeout: float = 5.0,
        hook_timeout: float = 30.0,
        log: Callable[[str], None] = warn,
        max_pending: int = 256,
    ) -> None:
        self.hook = tuple(hook) if hook else None
        self.webhook = webhook
        self.webhook_timeout = webhook_timeout
        self.hook_timeout = hook_timeout
        self.log = log
        self.sent = 0
        self.failed = 0
        self._queue: queue.Queue[Optional[dict[str, Any]]] = queue.Queue(max_pending)
        self._thread: Optional[threading.Thread] = None

    @property
    def enabled(self) -> bool:
        return bool(self.hook or self.webhook)

    def notify(self, event: dict[str, Any]) -> None:
        """Queue an event; never blocks (a full queue drops it, with a line)."""
        if not self.enabled:
            return
        if self._thread is None:
            self._thread = threading.Thread(target=self._work, name="gpuwarden-notify", daemon=True)
            self._thread.start()
        try:
            self._queue.put_nowait(event)
        except queue.Full:
            self.failed += 1
            self.log("too many notifications pending (hook or webhook too slow); dropped one")

    def close(self, timeout: float = 5.0) -> None:
        if self._thread is not None:
            with contextlib.suppress(queue.Full):
                self._queue.put_nowait(None)
            self._thread.join(timeout)

    def _work(self) -> None:
        while True:
            event = self._queue.get()
            if event is None:
                return
            if self.hook:
                self._run_hook(event)
            if self.webhook:
                self._post(event)

    def _run_hook(self, event: dict[str, Any]) -> None:
        env = dict(os.environ)
        for key, value in event.items():
            if value is not None and not isinstance(value, (dict, list)):
                env[f"GPUWARDEN_{key.upper()}"] = str(value)
        hook = self.hook or ("",)
        try:
            done = subprocess.run(
                list(hook),
                input=json.dumps(event),
                env=env,
                capture_output=True,
                text=True,
                timeout=self.hook_timeout,
                check=False,
            )
        except subprocess.TimeoutExpired:
            self.failed += 1
            self.log(f"hook {hook[0]!r} still running after {self.hook_timeout:g}s; killed")
        except OSError as err:
            self.failed += 1
            self.log(f"hook {hook[0]!r} could not run: {err.strerror or err}")
        else:
            if done.returncode != 0:
                self.failed += 1
                tail = (done.stderr or "").strip().splitlines()[-1:] or [""]
                self.log(f"hook {hook[0]!r} exited {done.returncode} {tail[0]}".rstrip())
            else:
                self.sent += 1

    def _post(self, event: dict[str, Any]) -> None:
        import urllib.error
        import urllib.request

        request = urllib.request.Request(
            self.webhook or "",
            data=json.dumps(event).encode(),
            headers={"Content-Type": "application/json", "User-Agent": "gpuwarden"},
            method="POST",
        )
        try:
            with urllib.request.urlopen(request, timeout=self.webhook_timeout) as reply:
                reply.read(65536)
            self.sent += 1
        except (TimeoutError, OSError) as err:
            self.failed += 1
            reason = getattr(err, "reason", None) or err
            if "timed out" in str(reason).lower() or isinstance(reason, TimeoutError):
                self.log(f"webhook {self.webhook} timed out after {self.webhook_timeout:g}s")
            else:
                self.log(f"webhook {self.webhook} failed: {reason}")
