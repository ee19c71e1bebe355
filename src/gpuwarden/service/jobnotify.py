"""Per-job notifications: `submit --notify begin,end,fail,timeout` to the user's own webhook.

Slurm mails a job's owner on the events its `--mail-type` names; here a job names the
events (Slurm's names: BEGIN, END, FAIL, REQUEUE, TIME_LIMIT, ALL, NONE; `timeout` is
TIME_LIMIT) and the submitting client adds the webhook of the user's own configuration
(`submit.webhook`). The service-wide webhook and mail (service.notify) stay as they are.

The POST is made as the job's owner, never as root: the notifier's helper process
runs `python -c POST URL` with the owner's uid, gid and groups and the event on its
standard input, so a URL can reach only what its user could reach anyway (no request
from the service's identity to a port of the user's choice).
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Optional, Protocol

from gpuwarden.base.errors import UserError

EVENTS = ("BEGIN", "END", "FAIL", "REQUEUE", "TIME_LIMIT")
_ALIASES = {"TIMEOUT": "TIME_LIMIT", "ALL": "ALL", "NONE": "NONE"}
MAX_URL = 2048


def events_of(text: str) -> tuple[str, ...]:
    """`begin,end,fail,timeout` (any case) as the events it names, one line per mistake."""
    chosen: list[str] = []
    for word in text.split(","):
        name = word.strip().upper()
        name = _ALIASES.get(name, name)
        if name == "ALL":
            chosen.extend(EVENTS)
        elif name == "NONE":
            continue
        elif name in EVENTS:
            chosen.append(name)
        else:
            raise UserError(
                f"invalid --notify {word.strip()[:40]!r}: one of begin, end, fail, requeue, "
                "timeout (time_limit), all, none"
            )
    return tuple(dict.fromkeys(chosen))


def checked_url(url: str) -> str:
    if len(url) > MAX_URL or not url.startswith(("http://", "https://")) or "\n" in url:
        raise UserError(f"a --notify webhook is an http:// or https:// URL under {MAX_URL} chars")
    return url


def matched(asked: Iterable[str], state: str) -> list[str]:
    """The asked events a job's end in `state` is (END for every end, as Slurm's)."""
    happened = {"END"}
    if state in ("FAILED", "LOST"):
        happened.add("FAIL")
    if state == "TIMEOUT":
        happened.add("TIME_LIMIT")
    return [e for e in asked if e in happened]


class Notified(Protocol):
    """What a job's event is made of: a journaled job (service.job.Job) has it all.
    Named here rather than imported, as the protocol and submit parsing import this
    module's checks and must not bring the journal along."""

    @property
    def id(self) -> int: ...
    @property
    def array_job(self) -> Optional[int]: ...
    @property
    def array_task(self) -> Optional[int]: ...
    @property
    def user(self) -> str: ...
    @property
    def state(self) -> str: ...
    @property
    def gpus(self) -> Sequence[str]: ...
    @property
    def output(self) -> Optional[str]: ...
    @property
    def request(self) -> Mapping[str, Any]: ...
    @property
    def uid(self) -> int: ...
    @property
    def gid(self) -> int: ...


class Poster(Protocol):
    """Who posts an event as the job's owner (service.notify.JobNotifier)."""

    def to_owner(self, event: dict[str, Any], url: str, uid: int, gid: int) -> None: ...


def wanted(request: Mapping[str, Any]) -> Optional[tuple[Sequence[str], str]]:
    """The events and the URL a journaled job asked for, or None."""
    notify = request.get("notify")
    if not isinstance(notify, dict) or not notify.get("url") or not notify.get("events"):
        return None
    return list(notify["events"]), str(notify["url"])


def event(job: Notified, kinds: Sequence[str], **more: Any) -> dict[str, Any]:
    """The JSON a job's webhook gets."""
    return {
        "event": kinds[0],
        "events": list(kinds),
        "job": job.id,
        "array_job": job.array_job,
        "array_task": job.array_task,
        "user": job.user,
        "state": more.pop("state", job.state),
        "gpus": list(more.pop("gpus", job.gpus)),
        "output": job.output,
        "at": time.time(),
        **more,
    }


def send(notifier: Poster, job: Notified, kinds: Sequence[str], **more: Any) -> None:
    """Hand one event to the notifier's helper, to be posted as the job's owner."""
    asked = wanted(job.request)
    if asked is None:
        return
    chosen = [k for k in kinds if k in asked[0]]
    if chosen:
        notifier.to_owner(event(job, chosen, **more), asked[1], job.uid, job.gid)


#: What the owner's process runs (`python -c POST URL CONNECT TOTAL`, the event on its
#: standard input): the standard library alone, so any Python the owner may run will do.
#: CONNECT bounds the connection and each read; an alarm ends it after TOTAL seconds
#: whatever the peer does (a byte a minute included).
POST = (
    "import signal, sys, urllib.request as r; "
    "signal.alarm(int(sys.argv[3])); "
    "q = r.Request(sys.argv[1], data=sys.stdin.buffer.read(), method='POST', "
    "headers={'Content-Type': 'application/json', 'User-Agent': 'gpuwarden'}); "
    "r.urlopen(q, timeout=float(sys.argv[2])).read(65536)"
)
