"""Telling a job's owner that it ended: a webhook (JSON POST) and/or local mail.

The service forks its supervisors, and a process that forks must not run
threads (a child could inherit a lock held by one and hang). So notifications
go to a helper process forked once, before any thread exists, which reads one
JSON event per line from a pipe and sends them (gpuwarden.alerts' Notifier posts the
webhook; `sendmail -t` delivers the mail). The service never waits for it: a
full pipe drops the event with a log line.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import subprocess
from typing import Any, Optional

log = logging.getLogger("gpuwarden.serve")


def mail_text(event: dict[str, Any]) -> str:
    """The mail for one ended job: a subject that says it all, and the details."""
    state = event.get("state", "ENDED")
    subject = f"gpuwarden job {event.get('job')} {state.lower()}"
    if event.get("exit_code") not in (None, 0):
        subject += f" (exit {event['exit_code']})"
    lines = [
        f"To: {event.get('user')}",
        f"Subject: {subject}",
        "",
        f"job:      {event.get('job')}",
        f"state:    {state}",
        f"command:  {' '.join(event.get('command') or [])}",
        f"gpus:     {', '.join(event.get('gpus') or []) or '-'}",
        f"elapsed:  {event.get('elapsed', 0):.0f} s",
    ]
    if event.get("error"):
        lines.append(f"error:    {event['error']}")
    if event.get("output"):
        lines.append(f"output:   {event['output']}")
    return "\n".join(lines) + "\n"


class JobNotifier:
    def __init__(self, webhook: Optional[str], sendmail: Optional[str]) -> None:
        self.webhook = webhook
        self.sendmail = sendmail
        self.pid: Optional[int] = None
        self.fd: Optional[int] = None

    @property
    def enabled(self) -> bool:
        return bool(self.webhook or self.sendmail)

    def start(self) -> None:
        """Fork the sender (call before any thread starts): always, since any job may
        name its owner's webhook (service.jobnotify)."""
        read, write = os.pipe2(os.O_CLOEXEC)
        pid = os.fork()
        if pid == 0:
            code = 0
            try:
                os.close(write)
                self._serve(read)
            except BaseException:
                code = 1
            finally:
                os._exit(code)
        os.close(read)
        os.set_blocking(write, False)
        self.pid, self.fd = pid, write

    def notify(self, event: dict[str, Any]) -> None:
        if self.fd is None:
            return
        try:
            os.write(self.fd, json.dumps(event).encode() + b"\n")
        except BlockingIOError:
            log.warning("notifications are backed up; dropped the one for job %s", event.get("job"))
        except OSError as err:
            log.warning("notification sender is gone (%s); no more notifications", err)
            self.close()

    def to_owner(self, event: dict[str, Any], url: str, uid: int, gid: int) -> None:
        """A job's own notification, posted to `url` as its owner (service.jobnotify)."""
        self.notify({**event, "_owner": {"url": url, "uid": uid, "gid": gid}})

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None
        if self.pid is not None:
            with contextlib.suppress(ChildProcessError):
                os.waitpid(self.pid, 0)
            self.pid = None

    def _serve(self, fd: int) -> None:
        from gpuwarden.alerts import Notifier

        poster = Notifier(webhook=self.webhook, log=lambda line: log.warning("%s", line))
        with os.fdopen(fd, "rb") as events:
            for line in events:
                try:
                    event = json.loads(line)
                except ValueError:
                    continue
                owner = event.pop("_owner", None)
                if isinstance(owner, dict):
                    self._as_owner(event, owner)
                    continue
                if self.webhook:
                    poster.notify(event)
                if self.sendmail and event.get("user"):
                    self._mail(event)
        poster.close()

    def _as_owner(self, event: dict[str, Any], owner: dict[str, Any]) -> None:
        """Post a job's own event as its owner: a fresh process with the owner's uid, gid
        and groups (set by subprocess between its fork and exec, no Python run there)."""
        import sys

        from gpuwarden.errors import UserError
        from gpuwarden.service.identity import person
        from gpuwarden.service.jobnotify import POST

        # The service's own Python where the owner may run it, else the system's.
        pythons = dict.fromkeys([sys.executable, "/usr/bin/python3"])
        why: object = "no Python to run"
        for python in pythons:
            try:
                who = person(int(owner["uid"]), int(owner["gid"]))
                subprocess.run(
                    [python, "-c", POST, str(owner["url"])],
                    input=json.dumps(event),
                    text=True,
                    capture_output=True,
                    timeout=30,
                    check=True,
                    user=who.uid,
                    group=who.gid,
                    extra_groups=list(who.groups),
                    cwd="/",
                    env={"PATH": "/usr/bin:/bin", "LC_ALL": "C.UTF-8"},
                )
                return
            except PermissionError as err:  # not theirs to run: the next one
                why = err
            except (OSError, subprocess.SubprocessError, UserError, KeyError, ValueError) as err:
                lines = str(getattr(err, "stderr", None) or err).strip().splitlines()
                why = lines[-1] if lines else err
                break
        log.warning("job %s: its webhook failed: %s", event.get("job"), why)

    def _mail(self, event: dict[str, Any]) -> None:
        try:
            subprocess.run(
                [str(self.sendmail), "-t"],
                input=mail_text(event),
                text=True,
                capture_output=True,
                timeout=30,
                check=True,
            )
        except (OSError, subprocess.SubprocessError) as err:
            log.warning("mail to %s failed: %s", event.get("user"), err)
