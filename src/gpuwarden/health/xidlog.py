"""The XID log: the XID events the health watch heard from NVML, kept on disk.

XIDs only exist as events: NVML delivers them to whoever is listening at the
moment. The health watch (exporter or `health --watch`) therefore appends each
one to a log in the state directory, which `xids_seen()` reads back, so a
one-shot `health` or `status` can still report them until the next boot or an
explicit `gpuwarden health --clear`.

Trust rule. The state directory may be writable by every user (mode 1777), and
whoever creates a file there owns it and can write anything into it. So each
writer appends only to a log of its own, and a reader believes only logs owned
by root, by the state directory's owner or by itself:

- the shared watch writes `xids.jsonl`: root's, or that of the state directory's
  owner (a service running as its own user); any other user's watch writes
  `xids.<uid>.jsonl`;
- a reader takes lines from `xids.jsonl` when root or the directory's owner owns
  it, and from its own `xids.<uid>.jsonl` when it owns it; a log with the wrong
  owner is ignored with a warning naming that owner (the shared watch replaces
  such a file: the name is its own);
- the watch drains only from what it heard itself (its own log and the events
  it could not write), never from a file someone else wrote.

Every line is validated; a malformed one is skipped and reported. The log is
opened without following symlinks or blocking on a FIFO, and only its last
`MAX_LOG` bytes are read.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Iterable

from gpuwarden.base.errors import UserError

TYPE_CHECKING = False  # typing stays off the start-up path; annotations need it only here
if TYPE_CHECKING:
    from typing import Any, Optional

    # One parsed line of an XID log, as JSON gives it: {"uuid", "xid", "index", "at"}
    # or {"clear", "at"} (parse_line checks each value's type).
    Event = dict[str, Any]

ROOT_LOG = "xids.jsonl"
#: Bytes of a log read at most (its tail): ~40,000 events.
MAX_LOG = 4 << 20
#: Longest GPU UUID accepted from a line (NVIDIA's are 40 characters, MIG's ~44).
MAX_UUID = 96

_reported: set[str] = set()


def report(message: str) -> None:
    """Say a problem with the XID log once per process on stderr: the exporter reads
    the log on every scrape, and one line per scrape would drown its log."""
    if message not in _reported:
        _reported.add(message)
        print(f"gpuwarden: warning: {message}", file=sys.stderr, flush=True)


def _state() -> str:
    from gpuwarden.files.locations import state_location

    return state_location()


def shared_writers(state: str) -> frozenset[int]:
    """Who writes the log everyone believes, `xids.jsonl`: root, and the owner of the
    state directory (a service running as its own user, the user of a private one).
    Nobody else can own that directory."""
    try:
        return frozenset({0, os.stat(state).st_uid})
    except OSError:
        return frozenset({0})


def log_name(uid: int, state: Optional[str] = None) -> str:
    """The file name of the log written by `uid`'s health watch."""
    writers = shared_writers(_state() if state is None else state)
    return ROOT_LOG if uid in writers else f"xids.{uid}.jsonl"


def log_location(uid: Optional[int] = None) -> str:
    """The log `uid` (default: this process) writes, in the configured state directory."""
    state = _state()
    return os.path.join(state, log_name(os.geteuid() if uid is None else uid, state))


def record_xid(
    uuid: str, xid: int, *, index: Optional[int] = None, at: Optional[float] = None
) -> None:
    """Append one XID event (one short line, O_APPEND: safe from several threads).
    Raises UserError when the log cannot be written (the caller reports it)."""
    line = json.dumps(
        {"uuid": uuid, "xid": int(xid), "index": index, "at": at or time.time()},
        separators=(",", ":"),
    )
    _append([line])


def clear_xids(uuids: Iterable[str] = ()) -> None:
    """Forget the XIDs seen so far, on the given GPUs (all when empty): the admin
    has reset or checked them. Writes to this user's own log, so it clears what this
    user's readers believe of it: the shared log only when run by its writer
    (root, or the state directory's owner)."""
    now = time.time()
    _append([json.dumps({"clear": u, "at": now}) for u in list(uuids) or ["*"]])


def _open_own(path: str, me: int, *, may_replace: bool) -> int:
    """A descriptor appending to `path`, a regular file owned by `me`. A shared writer
    (`may_replace`: root or the directory's owner, whom the sticky bit lets remove any
    file there) removes whatever else stands under the shared log's name (a symlink, a
    FIFO, a file planted by another user); anyone else gets a UserError naming it."""
    import stat

    from gpuwarden.files.safefiles import UnsafeFile, open_regular
    from gpuwarden.files.safefiles import owner_name as user_name

    try:
        st = os.lstat(path)
    except FileNotFoundError:
        st = None
    except OSError as err:
        raise UserError(f"cannot write the XID log {path}: {err.strerror}") from None
    if st is not None and (st.st_uid != me or not stat.S_ISREG(st.st_mode)):
        owner = user_name(st.st_uid)
        if not may_replace or stat.S_ISDIR(st.st_mode):
            raise UserError(
                f"cannot write the XID log {path}: it is not a file of {user_name(me)}'s "
                f"(owner {owner}); remove it, that name is kept for this user's health watch"
            )
        report(f"replacing {path}, made by {owner}: only the shared health watch writes it")
        _remove(path)
    flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT
    try:
        fd, st = open_regular(path, flags, 0o644, what="XID log")
    except UnsafeFile as err:  # planted again between the check and the open
        raise UserError(f"cannot write the XID log: {err}") from None
    except OSError as err:
        raise UserError(f"cannot write the XID log {path}: {err.strerror}") from None
    if st.st_uid != me:  # the same race; never append to a file someone else owns
        os.close(fd)
        raise UserError(f"cannot write the XID log {path}: it belongs to {user_name(st.st_uid)}")
    return fd


def _remove(path: str) -> None:
    try:
        os.unlink(path)
    except OSError as err:
        raise UserError(f"cannot replace the XID log {path}: {err.strerror}") from None


def _append(lines: list[str]) -> None:
    """Append to this user's XID log in the state directory, checked and created like
    the drains' (paths.ensure_dir)."""
    from gpuwarden.files.paths import ensure_dir
    from gpuwarden.files.safefiles import write_all

    state = _state()
    ensure_dir(state, "state directory")
    me = os.geteuid()
    path = os.path.join(state, log_name(me, state))
    fd = _open_own(path, me, may_replace=me in shared_writers(state))
    try:
        write_all(fd, "".join(line + "\n" for line in lines).encode("utf-8"))
    except OSError as err:
        raise UserError(f"cannot write the XID log {path}: {err.strerror}") from None
    finally:
        os.close(fd)


def trusted_logs(
    state: str, uids: Optional[Iterable[int]] = None
) -> list[tuple[str, frozenset[int]]]:
    """(path, owners believed) of each log a reader takes lines from: by default the
    shared log when root or the directory's owner owns it, and the reader's own; with
    `uids`, the log each of them writes, owned by it."""
    writers = shared_writers(state)
    if uids is not None:
        return [
            (os.path.join(state, log_name(u, state)), frozenset({u})) for u in sorted(set(uids))
        ]
    logs = [(os.path.join(state, ROOT_LOG), writers)]
    me = os.geteuid()
    if me not in writers:
        logs.append((os.path.join(state, log_name(me, state)), frozenset({me})))
    return logs


def _read_log(path: str, owners: frozenset[int], problems: list[str]) -> Optional[str]:
    """The text of the log at `path`, or None (absent, unsafe, not owned by `owners`)."""
    from gpuwarden.files.safefiles import UnsafeFile, open_regular, owner_name, read_bounded

    try:
        fd, st = open_regular(path, what="XID log")
    except FileNotFoundError:
        return None
    except UnsafeFile as err:
        problems.append(f"ignoring the XID log: {err}")
        return None
    except OSError as err:
        problems.append(f"cannot read the XID log {path}: {err.strerror}")
        return None
    try:
        if st.st_uid not in owners:
            allowed = " or ".join(owner_name(u) for u in sorted(owners))
            problems.append(
                f"ignoring the XID log {path}: it belongs to {owner_name(st.st_uid)}, "
                f"not {allowed} (only the health watch's own log is believed)"
            )
            return None
        skip_partial = st.st_size > MAX_LOG
        if skip_partial:
            problems.append(f"the XID log {path} is {st.st_size} bytes; reading its last {MAX_LOG}")
            os.lseek(fd, st.st_size - MAX_LOG, os.SEEK_SET)
        try:
            raw = read_bounded(fd, MAX_LOG, what=f"XID log {path}")
        except UnsafeFile:  # it grew while being read: the tail read so far is enough
            os.lseek(fd, -MAX_LOG, os.SEEK_END)
            raw = read_bounded(fd, MAX_LOG, what=f"XID log {path}")
            skip_partial = True
        except OSError as err:
            problems.append(f"cannot read the XID log {path}: {err.strerror}")
            return None
    finally:
        os.close(fd)
    text = raw.decode("utf-8", "replace")
    if skip_partial:
        text = text.partition("\n")[2]
    return text


def _number(value: object) -> Optional[float]:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        number = float(value)
    except OverflowError:
        return None
    return number if number - number == 0 else None  # inf - inf and nan - nan are nan


def parse_line(line: str) -> Event:
    """One validated line: {"uuid", "xid", "index", "at"} or {"clear", "at"}.
    Raises ValueError saying what is wrong."""
    try:
        item = json.loads(line)
    except (ValueError, RecursionError):
        raise ValueError("not JSON") from None
    if not isinstance(item, dict):
        raise ValueError("not a JSON object")
    at = _number(item.get("at"))
    if at is None or at < 0:
        raise ValueError("'at' is not a time")
    if "clear" in item:
        gone = item["clear"]
        if not isinstance(gone, str) or not gone or len(gone) > MAX_UUID:
            raise ValueError("'clear' is not a GPU UUID or '*'")
        return {"clear": gone, "at": at}
    uuid, xid, index = item.get("uuid"), item.get("xid"), item.get("index")
    if not isinstance(uuid, str) or not uuid or len(uuid) > MAX_UUID or not uuid.isprintable():
        raise ValueError("'uuid' is not a GPU UUID")
    if isinstance(xid, bool) or not isinstance(xid, int) or not 0 < xid < 100_000:
        raise ValueError("'xid' is not an XID number")
    if index is not None and (isinstance(index, bool) or not isinstance(index, int)):
        raise ValueError("'index' is not a GPU index")
    if index is not None and not 0 <= index < 4096:
        raise ValueError("'index' is not a GPU index")
    return {"uuid": uuid, "xid": xid, "index": index, "at": at}


def _events_of(text: str, path: str, since: float, problems: list[str]) -> list[Event]:
    events: list[Event] = []
    bad = 0
    first = ""
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            item = parse_line(line)
        except ValueError as err:
            bad += 1
            first = first or f"line {number}: {err}"
            continue
        if item["at"] < since:
            continue
        if "clear" in item:
            gone = item["clear"]
            events = [e for e in events if gone not in ("*", e["uuid"])]
        else:
            events.append(item)
    if bad:
        problems.append(f"skipped {bad} malformed line(s) of the XID log {path} ({first})")
    return events


def xid_events(
    since: Optional[float] = None,
    *,
    uids: Optional[Iterable[int]] = None,
    problems: Optional[list[str]] = None,
    state: Optional[str] = None,
) -> list[Event]:
    """XID events still in force, oldest first: after `since` (default: this boot)
    and after the last clear of their GPU in the same log, from the logs of `uids`
    (default `trusted_uids()`) in the state directory `state` (default: the configured
    one). Problems (a log ignored, lines skipped) are appended to `problems`, or
    reported on stderr once when it is None."""
    if since is None:
        since = boot_time()
    said: list[str] = [] if problems is None else problems
    events: list[Event] = []
    for path, owners in trusted_logs(_state() if state is None else state, uids):
        text = _read_log(path, owners, said)
        if text is not None:
            events.extend(_events_of(text, path, since, said))
    if problems is None and said:
        from gpuwarden.files.safefiles import printable

        for line in said:
            report(printable(line))
    events.sort(key=lambda e: e["at"])
    return events


def xids_seen(
    since: Optional[float] = None,
    *,
    uids: Optional[Iterable[int]] = None,
    problems: Optional[list[str]] = None,
    state: Optional[str] = None,
) -> dict[str, tuple[int, ...]]:
    """XIDs per GPU UUID, oldest first, for `judge(gpu, xids_seen().get(uuid, ()))`."""
    seen: dict[str, list[int]] = {}
    for event in xid_events(since, uids=uids, problems=problems, state=state):
        seen.setdefault(event["uuid"], []).append(event["xid"])
    return {uuid: tuple(x) for uuid, x in seen.items()}


def boot_time() -> float:
    """When this machine booted: XIDs from an earlier boot no longer count.

    Read from /proc/stat rather than psutil, whose import `gpuwarden status`
    would otherwise pay every time (docs/performance.md).
    """
    try:
        with open("/proc/stat", encoding="utf-8", errors="replace") as stat:
            for line in stat:
                if line.startswith("btime "):
                    return float(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return 0.0


def judged(
    gpus: Iterable[Any], rules: Any = None, *, conf: Any = None
) -> dict[str, tuple[Any, ...]]:
    """`health.judge_all` with the XIDs of the trusted XID logs (`xids_seen`): how every
    command that hands out or shows GPUs judges them, so a GPU the health watch heard
    a fatal XID from is never given to a job. `conf`, the caller's reading of the
    configuration, says where the logs are and, without `rules`, the health rules
    (None: the configuration in force, read here)."""
    from gpuwarden.health.judgement import judge_all, rules_in_force

    if conf is None:
        return judge_all(gpus, xids_seen(), rules)
    from gpuwarden.files.locations import state_location

    if rules is None:
        rules = rules_in_force(conf)
    return judge_all(gpus, xids_seen(state=state_location(conf)), rules)
