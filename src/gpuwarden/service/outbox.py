"""The notification helper's queues: one per sender, so nobody's webhook waits on another's.

Each job owner's posts wait in that owner's own queue, and the service's own (the
admin's `service.webhook` and `sendmail`) in one more; each queue is worked by its own
thread, one post at a time, each post bounded in time by its sender (service.notify).
A queue holds at most `per_key` events: past that, what a slow or dead webhook's owner
would get next is dropped, counted, and said once when it starts and once, with the
count, when the queue drains. Owners' posts run at most `at_once` together (the
service's own are never counted against that), so a thousand slow webhooks delay one
another but never the admin's.
"""

from __future__ import annotations

import collections
import logging
import threading
from collections.abc import Callable, Hashable
from typing import Any

log = logging.getLogger("gpuwarden.serve")

#: The key of the service's own notifications (the admin's webhook and mail).
SERVICE = "service"


class Outbox:
    def __init__(
        self,
        send: Callable[[Hashable, dict[str, Any]], None],
        per_key: int = 1000,
        at_once: int = 16,
        name: Callable[[Hashable], str] = str,
    ) -> None:
        self.send = send
        self.per_key = per_key
        self.name = name
        self.queues: dict[Hashable, collections.deque[dict[str, Any]]] = {}
        self.dropped: dict[Hashable, int] = {}
        self.lock = threading.Lock()
        self.owners = threading.BoundedSemaphore(at_once)
        self.stopped = False

    def put(self, key: Hashable, event: dict[str, Any]) -> bool:
        """Queue `event` for `key`'s sender; never blocks. False: dropped (its queue is full)."""
        with self.lock:
            if self.stopped:
                return False
            waiting = self.queues.get(key)
            if waiting is None:
                waiting = self.queues[key] = collections.deque()
                threading.Thread(
                    target=self._work, args=(key, waiting), name="gpuwarden-post", daemon=True
                ).start()
            if len(waiting) >= self.per_key:
                count = self.dropped.get(key, 0)
                self.dropped[key] = count + 1
                if count == 0:
                    log.warning(
                        "notifications for %s are backed up (%d waiting); dropping more until "
                        "they drain",
                        self.name(key),
                        len(waiting),
                    )
                return False
            waiting.append(event)
            return True

    def pending(self) -> int:
        with self.lock:
            return sum(len(q) for q in self.queues.values())

    def stop(self) -> int:
        """Send nothing more; how many events were still waiting (they are dropped).
        Safe in a signal handler: it does not wait long for a lock the interrupted
        thread may hold."""
        got = self.lock.acquire(timeout=0.5)
        try:
            self.stopped = True
            return sum(len(q) for q in list(self.queues.values()))
        finally:
            if got:
                self.lock.release()

    def _work(self, key: Hashable, waiting: collections.deque[dict[str, Any]]) -> None:
        """Send `key`'s events in order until its queue is empty, then end (the next
        event starts a new worker)."""
        while True:
            with self.lock:
                if not waiting or self.stopped:
                    self.queues.pop(key, None)
                    dropped = self.dropped.pop(key, 0)
                    break
                event = waiting.popleft()
            if key == SERVICE:
                self._send(key, event)
            else:
                with self.owners:
                    self._send(key, event)
        if dropped and not self.stopped:
            log.warning(
                "dropped %d notifications for %s while they were backed up", dropped, self.name(key)
            )

    def _send(self, key: Hashable, event: dict[str, Any]) -> None:
        if self.stopped:
            return
        try:
            self.send(key, event)
        except Exception:  # one post's failure (a bug) is not the queue's end
            log.exception("a notification for %s failed", self.name(key))
