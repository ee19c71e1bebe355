"""The weekly digest (gpuwarden.usage.digest) as the service keeps and sends it.

Opt-in: a user asks with `gpuwarden digest --subscribe`, which names their own
`submit.webhook` (posted as them, as their jobs' notifications are: service.jobnotify)
or `--mail` (the service's `sendmail`, to their name); `--unsubscribe` stops it. The
journal's `digests` table keeps who asked and when theirs was last sent. On the loop's
tick the service sends each one that is due (every `service.digest_every`, 7 days),
over the period since, through the notification helper's queues (service.notify,
service.outbox): a slow webhook delays only its owner's. With `service.admin_digest`
the admins get one too: JSON to `service.webhook`, mail to each admin named in
`service.admins` (root when only groups are named).
"""

from __future__ import annotations

import logging
import sqlite3
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, NamedTuple, Optional

from gpuwarden.base.errors import UserError

if TYPE_CHECKING:
    from typing import Protocol

    from gpuwarden.service.identity import Person
    from gpuwarden.service.notify import JobNotifier
    from gpuwarden.service.settings import Settings
    from gpuwarden.service.store import Store

    class Digesting(Protocol):
        """What digests need of the jobs' life (`joblife.JobLife` has it)."""

        settings: Settings
        store: Store
        notifier: JobNotifier


log = logging.getLogger("gpuwarden.serve")

SCHEMA = """
CREATE TABLE IF NOT EXISTS digests (
    uid INTEGER PRIMARY KEY,
    user TEXT NOT NULL,
    gid INTEGER NOT NULL,
    url TEXT,
    sent REAL NOT NULL
)
"""
#: The row that says when the admins' digest was last sent.
ADMINS = -1
ACTIONS = ("show", "subscribe", "unsubscribe")
#: How often the loop looks for digests that are due (more often for a shorter period).
CHECK_EVERY = 60.0


class Ask(NamedTuple):
    """A `digest` request: show one (the asker's, or the admins' for an admin), or
    subscribe to one by `url` (their webhook) or mail (no url), or unsubscribe."""

    action: str
    admin: bool = False
    url: Optional[str] = None
    days: float = 7.0


def request(message: Mapping[str, Any]) -> Ask:
    from gpuwarden.queueclient.protocol import ProtocolError
    from gpuwarden.service.jobnotify import checked_url

    action = message.get("action", "show")
    if action not in ACTIONS:
        raise ProtocolError(f"digest action must be one of {', '.join(ACTIONS)}")
    admin = message.get("admin", False)
    if not isinstance(admin, bool):
        raise ProtocolError("admin must be true or false")
    url = message.get("url")
    if url is not None:
        if not isinstance(url, str):
            raise ProtocolError("url must be a string")
        checked_url(url)
    days = message.get("days", 7)
    if isinstance(days, bool) or not isinstance(days, (int, float)) or not 0 < days <= 366:
        raise ProtocolError("days must be a number of days, 366 at most")
    return Ask(action, admin, url, float(days))


def ensure(db: sqlite3.Connection) -> None:
    db.execute(SCHEMA)


def answer(service: Digesting, who: Person, ask: Ask) -> dict[str, Any]:
    """The `digest` operation: a digest now over the last `days`, or a subscription."""
    db, state = service.store.db, service.settings.state_dir
    now = time.time()
    if ask.action == "show":
        since = now - ask.days * 86400
        if ask.admin:
            if not service.settings.admins.include(who):
                raise UserError("the admins' digest is for admins (service.admins)")
            return {"ok": True, "digest": for_admins(db, state, since, now)}
        return {"ok": True, "digest": for_user(db, state, who.name, since, now)}
    with service.store.transaction():
        ensure(db)
        if ask.action == "unsubscribe":
            gone = db.execute("DELETE FROM digests WHERE uid = ?", (who.uid,)).rowcount
            return {"ok": True, "subscribed": False, "was": bool(gone)}
        if ask.url is None and not service.settings.sendmail:
            raise UserError(
                "this machine sends no mail (service.sendmail): subscribe with your "
                "submit.webhook instead"
            )
        db.execute(
            "INSERT INTO digests (uid, user, gid, url, sent) VALUES (?, ?, ?, ?, ?) "
            "ON CONFLICT(uid) DO UPDATE SET user = excluded.user, gid = excluded.gid, "
            "url = excluded.url",
            (who.uid, who.name, who.gid, ask.url, now),
        )
    every = service.settings.digest_every
    return {"ok": True, "subscribed": True, "by": "webhook" if ask.url else "mail", "every": every}


def _by_user(db: sqlite3.Connection, state: str, since: float, until: float) -> list[Any]:
    """The report by user over [since, until): the journal's runs and, where a short
    `service.keep_history` moved some away, the archived ones (service.archive)."""
    from gpuwarden.service import accounting, archive

    old = archive.runs(state, since, until)
    return accounting.report(db, since, until, "user", "all", until, old)


def for_user(
    db: sqlite3.Connection, state: str, user: str, since: float, until: float
) -> dict[str, Any]:
    """`user`'s digest from the journal (and archives) in the state directory `state`."""
    from gpuwarden.usage import digest

    mine = next((r for r in _by_user(db, state, since, until) if r.name == user), None)
    jobs = _waste(db, state, since, until, "job", user)
    return digest.for_user(user, mine, jobs, since, until)


def for_admins(db: sqlite3.Connection, state: str, since: float, until: float) -> dict[str, Any]:
    from gpuwarden.usage import digest

    waste = _waste(db, state, since, until, "user")
    return digest.for_admins(_by_user(db, state, since, until), waste, since, until)


def _waste(
    db: sqlite3.Connection,
    state: str,
    since: float,
    until: float,
    by: str,
    user: Optional[str] = None,
) -> list[Any]:
    """The idle GPU-hours over [since, until), the archived runs' too."""
    from gpuwarden.service import accounting, archive

    used = archive.uses(state, since, until)
    return accounting.waste_report(db, since, until, by, user, used)


def tick(service: Digesting, now: float, last: float) -> float:
    """Send the digests that are due (at most every CHECK_EVERY seconds: returns when
    it last looked, to be handed back the next time)."""
    every = service.settings.digest_every
    if not every or now - last < min(CHECK_EVERY, every):
        return last
    db, state = service.store.db, service.settings.state_dir
    try:
        with service.store.transaction(durable=False):
            ensure(db)
            due = db.execute(
                "SELECT uid, user, gid, url, sent FROM digests WHERE uid >= 0 AND sent <= ?",
                (now - every,),
            ).fetchall()
            for uid, user, gid, url, sent in due:
                _send_user(service, uid, user, gid, url, for_user(db, state, user, sent, now))
                db.execute("UPDATE digests SET sent = ? WHERE uid = ?", (now, uid))
            if service.settings.admin_digest:
                row = db.execute("SELECT sent FROM digests WHERE uid = ?", (ADMINS,)).fetchone()
                if row is None:  # from now on: the first one a period after it was turned on
                    db.execute(
                        "INSERT INTO digests (uid, user, gid, sent) VALUES (?, '', 0, ?)",
                        (ADMINS, now),
                    )
                elif row[0] <= now - every:
                    _send_admins(service, for_admins(db, state, row[0], now))
                    db.execute("UPDATE digests SET sent = ? WHERE uid = ?", (now, ADMINS))
    except sqlite3.Error:
        log.exception("the digests could not be sent")
    return now


def _send_user(
    service: Digesting, uid: int, user: str, gid: int, url: Optional[str], digest: dict[str, Any]
) -> None:
    if url:
        service.notifier.to_owner(digest, url, uid, gid)
    else:
        service.notifier.notify({**digest, "_mail_only": True})
    log.info("digest for %s sent by %s", user, "webhook" if url else "mail")


def _send_admins(service: Digesting, digest: dict[str, Any]) -> None:
    settings = service.settings
    if settings.webhook:
        service.notifier.notify({**digest, "_webhook_only": True})
    if settings.sendmail:
        for name in sorted(settings.admins.users) or ["root"]:
            service.notifier.notify({**digest, "user": name, "_mail_only": True})
    log.info("the admins' digest sent")
