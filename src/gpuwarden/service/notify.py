"""Telling a job's owner that it ended: a webhook (JSON POST) and/or local mail.

The service forks its supervisors, and a process that forks must not run
threads (a child could inherit a lock held by one and hang). So notifications
go to a helper process forked once, before any thread exists, which reads one
JSON event per line from a pipe and hands each to its sender's queue
(service.outbox): the admin's `service.webhook` and `sendmail`, and each job
owner's own webhook (service.jobnotify), each in its own, so that one user's slow
or dead webhook delays and drops only that user's posts.

Nothing a user's webhook does can hold the service: every post is a process of its
own with a hard time (`CONNECT_SECONDS` to connect, `POST_SECONDS` in all, after
which it is killed); the helper keeps none of the service's descriptors (no journal
or socket lock, so a new `serve` starts at once after this one ends), ends at
SIGTERM and dies with the service (PR_SET_PDEATHSIG), dropping what was still
waiting with one line that counts it. The service never waits for it: a full pipe
drops the event with a log line.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import subprocess
import time
from collections.abc import Hashable
from typing import TYPE_CHECKING, Any, Optional

if TYPE_CHECKING:
    import threading

    from gpuwarden.service.identity import Person

log = logging.getLogger("gpuwarden.serve")

#: The most one post may take to connect, and in all (then its process is killed).
CONNECT_SECONDS = 5
POST_SECONDS = 15
#: How long a stopping service waits for the helper to end before it kills it.
STOP_SECONDS = 3.0
#: The pipe to the helper holds this much (a burst of a large array's ends).
PIPE_BYTES = 1 << 20
PR_SET_PDEATHSIG = 1


def mail_text(event: dict[str, Any]) -> str:
    """The mail for one ended job: a subject that says it all, and the details; or a
    digest (gpuwarden.usage.digest), its own text."""
    if event.get("event") == "DIGEST":
        whose = "your" if event.get("kind") == "user" else "this machine's"
        return f"To: {event.get('user')}\nSubject: gpuwarden: {whose} GPU use\n\n{event['text']}"
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
        with contextlib.suppress(OSError, AttributeError):
            import fcntl

            fcntl.fcntl(write, fcntl.F_SETPIPE_SZ, PIPE_BYTES)
        parent = os.getpid()
        pid = os.fork()
        if pid == 0:
            code = 0
            try:
                _detach(parent, keep=read)
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
        """Stop the helper: at once, whatever it still has to send (it says what it
        dropped); killed if it has not ended in STOP_SECONDS."""
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None
        if self.pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGTERM)
            deadline = time.monotonic() + STOP_SECONDS
            with contextlib.suppress(ChildProcessError):
                while os.waitpid(self.pid, os.WNOHANG) == (0, 0):
                    if time.monotonic() > deadline:
                        os.kill(self.pid, signal.SIGKILL)
                        os.waitpid(self.pid, 0)
                        break
                    time.sleep(0.02)
            self.pid = None

    # -- the helper process ----------------------------------------------------------

    def _serve(self, fd: int) -> None:
        import threading

        from gpuwarden.service.outbox import SERVICE, Outbox

        running: set[subprocess.Popen[str]] = set()
        guard = threading.Lock()
        outbox = Outbox(
            lambda key, event: self._send(key, event, running, guard), name=_sender_name
        )

        def stop(*_: object) -> None:
            left = outbox.stop()
            for proc in list(running):  # no lock: this interrupts whoever holds it
                with contextlib.suppress(OSError):
                    proc.kill()
            if left:
                log.warning("notification helper stopping: %d notifications not sent", left)
            os._exit(0)

        signal.signal(signal.SIGTERM, stop)
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # the terminal's Ctrl-C is the service's
        signal.signal(signal.SIGHUP, signal.SIG_IGN)
        with os.fdopen(fd, "rb") as events:
            for line in events:
                try:
                    event = json.loads(line)
                except ValueError:
                    continue
                owner = event.pop("_owner", None)
                if isinstance(owner, dict):
                    outbox.put(("owner", int(owner.get("uid", -1))), {**event, "_owner": owner})
                elif self.webhook or (self.sendmail and event.get("user")):
                    outbox.put(SERVICE, event)
        stop()  # the service closed the pipe: it is stopping

    def _send(
        self,
        key: Hashable,
        event: dict[str, Any],
        running: set[subprocess.Popen[str]],
        guard: threading.Lock,
    ) -> None:
        owner = event.pop("_owner", None)
        if isinstance(owner, dict):
            self._as_owner(event, owner, running, guard)
            return
        # A digest (service.digests) goes one way only: a user's to their mail, the
        # admins' to the webhook and to each admin's mail.
        mail_only, webhook_only = event.pop("_mail_only", False), event.pop("_webhook_only", False)
        if self.webhook and not mail_only:
            why = _post(self.webhook, event, running, guard, None)
            if why:
                log.warning("webhook %s failed: %s", self.webhook, why)
        if self.sendmail and event.get("user") and not webhook_only:
            why = _run([str(self.sendmail), "-t"], mail_text(event), running, guard, None)
            if why:
                log.warning("mail to %s failed: %s", event.get("user"), why)

    def _as_owner(
        self,
        event: dict[str, Any],
        owner: dict[str, Any],
        running: set[subprocess.Popen[str]],
        guard: threading.Lock,
    ) -> None:
        """Post a job's own event as its owner: a fresh process with the owner's uid, gid
        and groups (set by subprocess between its fork and exec, no Python run there)."""
        import sys

        from gpuwarden.base.errors import UserError
        from gpuwarden.service.identity import person

        try:
            who = person(int(owner["uid"]), int(owner["gid"]))
        except (UserError, KeyError, ValueError) as err:
            log.warning("job %s: its webhook failed: %s", event.get("job"), err)
            return
        # The service's own Python where the owner may run it, else the system's.
        why: object = "no Python to run"
        for python in dict.fromkeys([sys.executable, "/usr/bin/python3"]):
            why = _post(str(owner["url"]), event, running, guard, who, python)
            if not isinstance(why, PermissionError):  # not theirs to run: the next one
                break
        if why:
            log.warning("job %s: its webhook failed: %s", event.get("job"), why)


def _sender_name(key: Hashable) -> str:
    if isinstance(key, tuple):
        return f"uid {key[1]}'s webhook"
    return "the service's webhook and mail"


def _detach(parent: int, keep: int) -> None:
    """Make the forked helper hold nothing of the service's: every descriptor but the
    standard ones and its pipe closed (the journal's and socket's locks stay the
    service's alone), and killed when the service dies, however it dies."""
    os.closerange(3, keep)
    os.closerange(keep + 1, 1 << 16)
    for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
        signal.signal(sig, signal.SIG_DFL)
    with contextlib.suppress(OSError, AttributeError):
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent:  # the service died before the line above
        os._exit(0)


def _post(
    url: str,
    event: dict[str, Any],
    running: set[subprocess.Popen[str]],
    guard: threading.Lock,
    who: Optional[Person],
    python: Optional[str] = None,
) -> object:
    """POST `event` to `url` from a process of its own (as `who`, or as the service):
    None when it was sent, else why not."""
    import sys

    from gpuwarden.service.jobnotify import POST

    argv = [python or sys.executable, "-c", POST, url, str(CONNECT_SECONDS), str(POST_SECONDS)]
    return _run(argv, json.dumps(event), running, guard, who)


def _run(
    argv: list[str],
    text: str,
    running: set[subprocess.Popen[str]],
    guard: threading.Lock,
    who: Optional[Person],
) -> object:
    """Run `argv` with `text` on its input for at most POST_SECONDS (then killed):
    None when it exited 0, else why not (a PermissionError as itself)."""
    owner: dict[str, Any] = {}
    if who is not None:
        owner = {
            "user": who.uid,
            "group": who.gid,
            "extra_groups": list(who.groups),
            "cwd": "/",
            "env": {"PATH": "/usr/bin:/bin", "LC_ALL": "C.UTF-8"},
        }
    try:
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            **owner,
        )
    except PermissionError as err:
        return err
    except (OSError, subprocess.SubprocessError, ValueError) as err:
        return err
    with guard:
        running.add(proc)
    try:
        _, said = proc.communicate(text, timeout=POST_SECONDS)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        return f"no answer in {POST_SECONDS} s; stopped"
    finally:
        with guard:
            running.discard(proc)
    if proc.returncode != 0:
        lines = (said or "").strip().splitlines()
        return lines[-1][:300] if lines else f"exit status {proc.returncode}"
    return None
