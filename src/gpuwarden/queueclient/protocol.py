"""The service's wire format, and the validation of every request before it is used.

One JSON object per line over a Unix stream socket, at most `MAX_MESSAGE` bytes and
`MAX_DEPTH` levels of nesting (a deeper one is refused before the parser recurses).
Every request names the protocol version (`"v": 1`) and an operation (`"op"`);
every answer has `"ok"` and either the result or a one-line `"error"`. A client of
another version gets an error naming both versions, never a guess. Nothing here
trusts the client: each field is checked for type and range, and a request that
fails gets one line naming the field (`ProtocolError`), never a traceback, and
never reaches the queue.
"""

from __future__ import annotations

import json
from collections.abc import Mapping

from gpuwarden.base.checked import ProtocolError as ProtocolError  # its errors' type
from gpuwarden.base.checked import (
    checked_bool,
    checked_int,
    checked_number,
    checked_path,
    checked_string,
    checked_strings,
    optional,
)
from gpuwarden.base.errors import UserError
from gpuwarden.base.records import record
from gpuwarden.placement.requestwire import from_wire
from gpuwarden.queueclient.depth import nesting

TYPE_CHECKING = False  # typing stays off a client's start-up path (`run` through the service)
if TYPE_CHECKING:
    from typing import Any, NoReturn, Optional

    from gpuwarden.placement.request import Request

VERSION = 1
MAX_MESSAGE = 1 << 20  # a submit carries an environment: generous, but bounded
MAX_ENV = 4096  # variables
MAX_WORDS = 65536  # command words
MAX_IDS = 1024
MAX_TIME = 10 * 365 * 86400.0
MAX_DEPTH = 16  # objects and lists inside each other: a request needs 3
#: What one answer of a listing (`queue`, `jobs`) may take on the wire; more rows are paged.
PAGE_BYTES = 256 << 10
PAGE_ROWS = 500  # rows of a page when the client names no limit
MAX_PAGE_ROWS = 5000

OPS = (
    "hello",
    "submit",
    "queue",
    "jobs",
    "cancel",
    "hold",
    "release",
    "logs",
    "share",
    "signal",
    "stats",
    "requeue",
    "book",
    "bookings",
    "unbook",
    "attach",
    "reload",
    "limits",
    "report",
    "eff",
    "join",
    "digest",
    "submit_argv",
)


def encode(message: Mapping[str, Any]) -> bytes:
    """One message on the wire: compact JSON and a newline."""
    data = json.dumps(message, separators=(",", ":"), allow_nan=False).encode("utf-8") + b"\n"
    if len(data) > MAX_MESSAGE:
        raise ProtocolError(f"message of {len(data)} bytes is larger than {MAX_MESSAGE}")
    return data


class Decoder:
    """Splits a byte stream into messages; refuses a line longer than MAX_MESSAGE
    before buffering it all, so a client cannot make the service hold a gigabyte."""

    def __init__(self) -> None:
        self.buffer = bytearray()

    def feed(self, data: bytes) -> list[dict[str, Any]]:
        self.buffer += data
        messages: list[dict[str, Any]] = []
        while True:
            end = self.buffer.find(b"\n")
            if end < 0:
                if len(self.buffer) > MAX_MESSAGE:
                    raise ProtocolError(f"message larger than {MAX_MESSAGE} bytes")
                return messages
            line = bytes(self.buffer[:end])
            del self.buffer[: end + 1]
            if len(line) > MAX_MESSAGE:
                raise ProtocolError(f"message larger than {MAX_MESSAGE} bytes")
            messages.append(parse(line))


def parse(line: bytes) -> dict[str, Any]:
    """A message from one line: a JSON object of this protocol's version with a known op."""
    depth = nesting(line, MAX_DEPTH)  # counted before the parser recurses
    if depth > MAX_DEPTH:
        raise ProtocolError(f"message nested {depth} deep; the most is {MAX_DEPTH} (MAX_DEPTH)")
    try:
        value = json.loads(line.decode("utf-8"), parse_constant=_no_constant)
    except (UnicodeDecodeError, ValueError, RecursionError) as err:
        raise ProtocolError(f"not a JSON message: {err}") from None
    if not isinstance(value, dict):
        raise ProtocolError("a message is a JSON object")
    version = value.get("v")
    if version != VERSION:
        raise ProtocolError(
            f"protocol version {version!r} is not supported (this service: {VERSION})"
        )
    return value


def _no_constant(name: str) -> NoReturn:
    raise ValueError(f"{name} is not a number")


def op_of(message: Mapping[str, Any]) -> str:
    op = message.get("op")
    if op not in OPS:
        raise ProtocolError(f"unknown operation {op!r}; known: {', '.join(OPS)}")
    return str(op)


# --- field checks --------------------------------------------------------------


def job_ids(value: object, name: str = "jobs") -> tuple[int, ...]:
    """A non-empty list of job ids (positive integers)."""
    if not isinstance(value, list) or not value:
        raise ProtocolError(f"{name} must be a non-empty list of job ids")
    if len(value) > MAX_IDS:
        raise ProtocolError(f"{name} has more than {MAX_IDS} entries")
    return tuple(checked_int(v, "job id", 1, 2**62) for v in value)


def job_names(value: object, name: str = "jobs") -> tuple[int | tuple[int, int], ...]:
    """A non-empty list of job ids, each a positive integer (a job, or a whole array by
    its id) or an array's task as `"12_7"` (its array's id and the task id)."""
    from gpuwarden.planning.arrayspec import task_name

    if not isinstance(value, list) or not value:
        raise ProtocolError(f"{name} must be a non-empty list of job ids")
    if len(value) > MAX_IDS:
        raise ProtocolError(f"{name} has more than {MAX_IDS} entries")
    names: list[int | tuple[int, int]] = []
    for v in value:
        if isinstance(v, str):
            task = task_name(v)
            if task is None:
                raise ProtocolError(f"job id {v[:40]!r} is neither a number nor ARRAY_TASK")
            names.append(task)
        else:
            names.append(checked_int(v, "job id", 1, 2**62))
    return tuple(names)


# --- requests of one job, of several, of none ------------------------------------


def nothing(message: Mapping[str, Any]) -> None:
    """The record of a request with no fields (hello, stats, share, limits, reload)."""
    return None


def one_job(message: Mapping[str, Any]) -> int:
    """The job a request names (`"job": ID`): logs, requeue, attach."""
    (job_id,) = job_ids([message.get("job")], "job")
    return job_id


def jobs_named(message: Mapping[str, Any]) -> tuple[int | tuple[int, int], ...]:
    """The jobs a request names (`"jobs": [...]`): cancel, hold, release."""
    return job_names(message.get("jobs"))


@record
class Signal:
    """A `signal` request: the job and the signal to deliver to it."""

    job: int
    number: int


def signalling(message: Mapping[str, Any]) -> Signal:
    return Signal(one_job(message), signal_number(message.get("signal")))


# --- submit --------------------------------------------------------------------


@record
class Submit:
    """A validated `submit` (or attached `run`) request: what the service journals."""

    argv: tuple[str, ...]
    cwd: str
    env: Mapping[str, str]
    umask: int
    gpus: Request  # what it asks of the GPUs (placement.requestwire: its wire form)
    time_limit: Optional[float] = None
    nice: int = 0
    hold: bool = False
    after: tuple[int, ...] = ()
    output: Optional[str] = None
    attached: bool = False
    wait: bool = True  # False: start now or not at all (`run` without --wait)
    # Slurm's --signal=[B:]SIG@SECONDS: (signal, seconds before the time limit, only the
    # job's first process rather than all of them)
    warning: Optional[tuple[int, float, bool]] = None
    array: Optional[str] = None  # sbatch's --array (service.arrays reads it)
    params: tuple[str, ...] = ()  # --param NAME=V1,V2: one task per combination
    begin: Optional[float] = None  # --begin, seconds since the epoch
    notify: tuple[str, ...] = ()  # --notify: events posted to notify_url (service.jobnotify)
    notify_url: Optional[str] = None
    account: Optional[str] = None  # --account: whose GPU-hours these are (service.accounts)
    max_retries: int = 0  # --max-retries: queued again after a failure, this many times
    preemptible: bool = False  # --preemptible: on idle GPUs, given back when needed
    preempt: str = "requeue"  # --preempt: what preemption does to it (requeue or cancel)


#: What preemption may do to a preemptible job, as Slurm's PreemptMode.
PREEMPT_MODES = ("requeue", "cancel")
MAX_RETRIES = 100


def submit(message: Mapping[str, Any]) -> Submit:
    """A validated submit request."""
    from gpuwarden.service.spawn import argv_of

    try:
        argv = tuple(argv_of(message.get("argv")))
    except UserError as err:
        raise ProtocolError(f"argv: {err}") from None
    if len(argv) > MAX_WORDS:
        raise ProtocolError(f"argv has more than {MAX_WORDS} words")
    env = message.get("env", {})
    if not isinstance(env, dict):
        raise ProtocolError("env must be an object of strings")
    if len(env) > MAX_ENV:
        raise ProtocolError(f"env has more than {MAX_ENV} variables")
    for key, val in env.items():
        checked_string(key, "env name", 4096)
        if "=" in key:
            raise ProtocolError(f"env name {key[:40]!r} contains '='")
        checked_string(val, f"env {key[:40]}", MAX_MESSAGE, empty=True)
    after = message.get("after", [])
    return Submit(
        argv=argv,
        cwd=checked_path(message.get("cwd"), "cwd"),
        env=dict(env),
        umask=checked_int(message.get("umask", 0o022), "umask", 0, 0o777),
        gpus=from_wire(message.get("request")),
        time_limit=optional(
            message.get("time_limit"), checked_number, "time_limit", 0.0, MAX_TIME, True
        ),
        nice=checked_int(message.get("nice", 0), "nice", -20, 19),
        hold=checked_bool(message.get("hold", False), "hold"),
        after=job_ids(after, "after") if after else (),
        output=optional(message.get("output"), checked_path, "output"),
        attached=checked_bool(message.get("attached", False), "attached"),
        wait=checked_bool(message.get("wait", True), "wait"),
        warning=optional(message.get("signal"), warning),
        array=optional(message.get("array"), checked_string, "array", 1024),
        params=checked_strings(message.get("params", []), "params", 64),
        begin=optional(message.get("begin"), checked_number, "begin", 0.0, 1e11),
        notify=_events(message.get("notify", [])),
        notify_url=optional(message.get("notify_url"), _url),
        account=optional(message.get("account"), _account),
        max_retries=checked_int(message.get("max_retries", 0), "max_retries", 0, MAX_RETRIES),
        preemptible=checked_bool(message.get("preemptible", False), "preemptible"),
        preempt=_choice(message.get("preempt", "requeue"), "preempt", PREEMPT_MODES),
    )


def _choice(value: object, what: str, choices: tuple[str, ...]) -> str:
    if value not in choices:
        raise ProtocolError(f"{what} must be one of {', '.join(choices)}")
    return str(value)


def _account(value: object) -> str:
    import re

    text = checked_string(value, "account", 64)
    if not re.fullmatch(r"[A-Za-z0-9][\w.-]*", text):
        raise ProtocolError("account must be letters, digits, '_', '.' or '-'")
    return text


def _events(value: object) -> tuple[str, ...]:
    from gpuwarden.service.jobnotify import EVENTS

    events = checked_strings(value, "notify", len(EVENTS))
    for name in events:
        if name not in EVENTS:
            raise ProtocolError(f"notify: {name[:20]!r} is not one of {', '.join(EVENTS)}")
    return events


def _url(value: object) -> str:
    from gpuwarden.service.jobnotify import MAX_URL, checked_url

    try:
        return checked_url(checked_string(value, "notify_url", MAX_URL))
    except UserError as err:
        raise ProtocolError(str(err)) from None


def warning(value: object) -> tuple[int, float, bool]:
    """`{"number": SIG, "before": SECONDS, "batch": false}`: a signal sent SECONDS
    before the time limit (Slurm's --signal), to every process of the job or, with
    `batch`, to its first process only."""
    if not isinstance(value, dict) or set(value) - {"number", "before", "batch"}:
        raise ProtocolError("signal must be an object with number, before and batch")
    return (
        checked_int(value.get("number"), "signal.number", 1, 64),
        checked_number(value.get("before", 60), "signal.before", 0.0, MAX_TIME),
        checked_bool(value.get("batch", False), "signal.batch"),
    )


# --- listings --------------------------------------------------------------------


@record
class Listing:
    """Which rows of `queue` or `jobs` a client asks for: a page of at most `limit`
    rows from `offset` on, only `user`'s or only the jobs `ids` where given. The
    service answers at most PAGE_BYTES a page whatever the limit, and says where
    the next page starts (`next`) while there are more."""

    limit: int = PAGE_ROWS
    offset: int = 0
    user: Optional[str] = None
    ids: tuple[int, ...] = ()
    arrays: bool = False  # an array's waiting tasks in one row, as squeue shows them
    table: bool = False  # `queue`'s table as lines (service.queuetext), not rows


def listing(message: Mapping[str, Any]) -> Listing:
    ids = message.get("ids")
    return Listing(
        limit=checked_int(message.get("limit", PAGE_ROWS), "limit", 1, MAX_PAGE_ROWS),
        offset=checked_int(message.get("offset", 0), "offset", 0, 2**62),
        user=optional(message.get("user"), checked_string, "user", 256),
        ids=job_ids(ids, "ids") if ids is not None else (),
        arrays=checked_bool(message.get("arrays", False), "arrays"),
        table=checked_bool(message.get("table", False), "table"),
    )


@record
class Report:
    """A `report` request: GPU usage between `since` and `until` (seconds since the
    epoch), grouped `by` user, group, account or job, `per` day, week, month or all;
    with `waste`, the GPU-hours held idle instead (gpuwarden.usage.report)."""

    since: float
    until: float
    by: str = "user"
    per: str = "all"
    waste: bool = False


def report(message: Mapping[str, Any]) -> Report:
    from gpuwarden.usage.report import BY, PER

    since = checked_number(message.get("since"), "since", 0.0, 1e11)
    until = checked_number(message.get("until"), "until", 0.0, 1e11)
    if until <= since:
        raise ProtocolError("until must be after since")
    by = checked_string(message.get("by", "user"), "by", 20)
    per = checked_string(message.get("per", "all"), "per", 20)
    if by not in BY:
        raise ProtocolError(f"by must be one of {', '.join(BY)}")
    if per not in PER:
        raise ProtocolError(f"per must be one of {', '.join(PER)}")
    return Report(since, until, by, per, checked_bool(message.get("waste", False), "waste"))


def eff_jobs(message: Mapping[str, Any]) -> tuple[int, ...]:
    """The jobs an `eff` request names (`"jobs": [...]`), at most 100."""
    ids = job_ids(message.get("jobs"))
    if len(ids) > 100:
        raise ProtocolError("eff: at most 100 jobs at once")
    return ids


def signal_number(value: object) -> int:
    """A signal a client may ask to deliver to its attached job."""
    import signal

    allowed = {
        int(s)
        for s in (
            signal.SIGINT,
            signal.SIGTERM,
            signal.SIGHUP,
            signal.SIGQUIT,
            signal.SIGUSR1,
            signal.SIGUSR2,
            signal.SIGKILL,
        )
    }
    number = checked_int(value, "signal", 1, 64)
    if number not in allowed:
        raise ProtocolError(f"signal {number} may not be sent to a job")
    return number
