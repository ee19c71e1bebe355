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
import math
import os
from collections.abc import Mapping

from gpuwarden.errors import UserError
from gpuwarden.records import record

TYPE_CHECKING = False  # typing stays off a client's start-up path (`run` through the service)
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any, NoReturn, Optional, TypeVar

    T = TypeVar("T")

VERSION = 1
MAX_MESSAGE = 1 << 20  # a submit carries an environment: generous, but bounded
MAX_ENV = 4096  # variables
MAX_WORDS = 65536  # command words
MAX_PATH = 4096
MAX_IDS = 1024
MAX_TIME = 10 * 365 * 86400.0
MAX_BYTES = 1 << 60
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
    "digest",
)


class ProtocolError(UserError):
    """A malformed or refused request; the message is sent back as the error."""


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
    depth = nesting(line)
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


def nesting(line: bytes) -> int:
    """How deep brackets nest in a JSON text, strings skipped: counted before parsing, so
    that `[` x 50,000 is refused in one line instead of recursing in the parser. Scans
    only the structural bytes (`bytes.translate` keeps brackets, quotes and
    backslashes), so a 1 MiB message costs about a millisecond."""
    kept = line.translate(None, _NOT_STRUCTURAL)
    if b"[" not in kept and b"{" not in kept:
        return 0
    depth = deepest = 0
    inside = escaped = False
    for byte in kept:
        if inside:
            if escaped:
                escaped = False
            elif byte == 0x5C:  # backslash
                escaped = True
            elif byte == 0x22:
                inside = False
        elif byte == 0x22:
            inside = True
        elif byte in (0x5B, 0x7B):
            depth += 1
            if depth > deepest:
                deepest = depth
                if deepest > MAX_DEPTH:
                    return deepest
        elif byte in (0x5D, 0x7D):
            depth -= 1
    return deepest


_NOT_STRUCTURAL = bytes(b for b in range(256) if b not in b'[]{}"\\')


def _no_constant(name: str) -> NoReturn:
    raise ValueError(f"{name} is not a number")


def op_of(message: Mapping[str, Any]) -> str:
    op = message.get("op")
    if op not in OPS:
        raise ProtocolError(f"unknown operation {op!r}; known: {', '.join(OPS)}")
    return str(op)


# --- field checks --------------------------------------------------------------


def _string(value: object, name: str, limit: int = MAX_PATH, empty: bool = False) -> str:
    if not isinstance(value, str):
        raise ProtocolError(f"{name} must be a string")
    if "\0" in value:
        raise ProtocolError(f"{name} must not contain a NUL byte")
    if len(value) > limit:
        raise ProtocolError(f"{name} is longer than {limit} characters")
    if not empty and not value:
        raise ProtocolError(f"{name} must not be empty")
    return value


def _path(value: object, name: str) -> str:
    text = _string(value, name)
    if not os.path.isabs(text):
        raise ProtocolError(f"{name} must be an absolute path")
    return text


def _int(value: object, name: str, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ProtocolError(f"{name} must be an integer")
    if not low <= value <= high:
        raise ProtocolError(f"{name} must be between {low} and {high}")
    return value


def _number(value: object, name: str, low: float, high: float, open_low: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ProtocolError(f"{name} must be a finite number")
    if value < low or value > high or (open_low and value == low):
        raise ProtocolError(
            f"{name} must be {'above' if open_low else 'at least'} {low} and at most {high}"
        )
    return float(value)


def _optional(value: object, check: Callable[..., T], *args: Any) -> Optional[T]:
    return None if value is None else check(value, *args)


def _strings(value: object, name: str, limit: int) -> tuple[str, ...]:
    if not isinstance(value, list):
        raise ProtocolError(f"{name} must be a list of strings")
    if len(value) > limit:
        raise ProtocolError(f"{name} has more than {limit} entries")
    return tuple(_string(v, f"{name} entry", empty=True) for v in value)


def job_ids(value: object, name: str = "jobs") -> tuple[int, ...]:
    """A non-empty list of job ids (positive integers)."""
    if not isinstance(value, list) or not value:
        raise ProtocolError(f"{name} must be a non-empty list of job ids")
    if len(value) > MAX_IDS:
        raise ProtocolError(f"{name} has more than {MAX_IDS} entries")
    return tuple(_int(v, "job id", 1, 2**62) for v in value)


def job_names(value: object, name: str = "jobs") -> tuple[int | tuple[int, int], ...]:
    """A non-empty list of job ids, each a positive integer (a job, or a whole array by
    its id) or an array's task as `"12_7"` (its array's id and the task id)."""
    from gpuwarden.arrayspec import task_name

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
            names.append(_int(v, "job id", 1, 2**62))
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
class GpuRequest:
    """What the job asks of the GPUs (the fields of selection.Request)."""

    count: int = 1
    gpus: Optional[tuple[str, ...]] = None
    exclude: tuple[str, ...] = ()
    model: Optional[str] = None
    min_capability: Optional[tuple[int, int]] = None
    min_free: Optional[int] = None
    max_util: Optional[float] = None
    mem: Optional[int] = None
    mig: Optional[str] = None  # a MIG profile, as config.values reads it


@record
class Submit:
    """A validated `submit` (or attached `run`) request: what the service journals."""

    argv: tuple[str, ...]
    cwd: str
    env: Mapping[str, str]
    umask: int
    gpus: GpuRequest
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


def gpu_request(value: object) -> GpuRequest:
    if value is None:
        return GpuRequest()
    if not isinstance(value, dict):
        raise ProtocolError("request must be an object")
    unknown = set(value) - {f for f in GpuRequest.__dataclass_fields__}
    if unknown:
        raise ProtocolError(f"request has unknown fields: {', '.join(sorted(unknown))}")
    gpus = _optional(value.get("gpus"), _strings, "request.gpus", 1024)
    if gpus is not None and (not gpus or not all(gpus)):
        raise ProtocolError("request.gpus names no GPU (an empty name); leave it out for any GPU")
    count = value.get("count")
    count = len(gpus or ()) or 1 if count is None else _int(count, "request.count", 0, 1024)
    capability = value.get("min_capability")
    if capability is not None:
        if not isinstance(capability, list) or len(capability) != 2:
            raise ProtocolError("request.min_capability must be [major, minor]")
        capability = (
            _int(capability[0], "request.min_capability major", 0, 100),
            _int(capability[1], "request.min_capability minor", 0, 100),
        )
    return GpuRequest(
        count=count,
        gpus=gpus,
        exclude=_strings(value.get("exclude", []), "request.exclude", 1024),
        model=_optional(value.get("model"), _string, "request.model", 200),
        min_capability=capability,
        min_free=_optional(value.get("min_free"), _int, "request.min_free", 1, MAX_BYTES),
        max_util=_optional(value.get("max_util"), _number, "request.max_util", 0.0, 100.0),
        mem=_optional(value.get("mem"), _int, "request.mem", 1, MAX_BYTES),
        mig=_optional(value.get("mig"), _profile, "request.mig"),
    )


def _profile(value: object, what: str) -> str:
    from gpuwarden.config.values import KINDS, BadValue

    try:
        return str(KINDS["profile"][0](value))
    except BadValue:
        raise ProtocolError(f"{what} must be a MIG profile such as 1g.10gb") from None


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
        _string(key, "env name", 4096)
        if "=" in key:
            raise ProtocolError(f"env name {key[:40]!r} contains '='")
        _string(val, f"env {key[:40]}", MAX_MESSAGE, empty=True)
    after = message.get("after", [])
    return Submit(
        argv=argv,
        cwd=_path(message.get("cwd"), "cwd"),
        env=dict(env),
        umask=_int(message.get("umask", 0o022), "umask", 0, 0o777),
        gpus=gpu_request(message.get("request")),
        time_limit=_optional(message.get("time_limit"), _number, "time_limit", 0.0, MAX_TIME, True),
        nice=_int(message.get("nice", 0), "nice", -20, 19),
        hold=_bool(message.get("hold", False), "hold"),
        after=job_ids(after, "after") if after else (),
        output=_optional(message.get("output"), _path, "output"),
        attached=_bool(message.get("attached", False), "attached"),
        wait=_bool(message.get("wait", True), "wait"),
        warning=_optional(message.get("signal"), warning),
        array=_optional(message.get("array"), _string, "array", 1024),
        params=_strings(message.get("params", []), "params", 64),
        begin=_optional(message.get("begin"), _number, "begin", 0.0, 1e11),
        notify=_events(message.get("notify", [])),
        notify_url=_optional(message.get("notify_url"), _url),
        account=_optional(message.get("account"), _account),
        max_retries=_int(message.get("max_retries", 0), "max_retries", 0, MAX_RETRIES),
        preemptible=_bool(message.get("preemptible", False), "preemptible"),
        preempt=_choice(message.get("preempt", "requeue"), "preempt", PREEMPT_MODES),
    )


def _choice(value: object, what: str, choices: tuple[str, ...]) -> str:
    if value not in choices:
        raise ProtocolError(f"{what} must be one of {', '.join(choices)}")
    return str(value)


def _account(value: object) -> str:
    import re

    text = _string(value, "account", 64)
    if not re.fullmatch(r"[A-Za-z0-9][\w.-]*", text):
        raise ProtocolError("account must be letters, digits, '_', '.' or '-'")
    return text


def _events(value: object) -> tuple[str, ...]:
    from gpuwarden.service.jobnotify import EVENTS

    events = _strings(value, "notify", len(EVENTS))
    for name in events:
        if name not in EVENTS:
            raise ProtocolError(f"notify: {name[:20]!r} is not one of {', '.join(EVENTS)}")
    return events


def _url(value: object) -> str:
    from gpuwarden.service.jobnotify import MAX_URL, checked_url

    try:
        return checked_url(_string(value, "notify_url", MAX_URL))
    except UserError as err:
        raise ProtocolError(str(err)) from None


def warning(value: object) -> tuple[int, float, bool]:
    """`{"number": SIG, "before": SECONDS, "batch": false}`: a signal sent SECONDS
    before the time limit (Slurm's --signal), to every process of the job or, with
    `batch`, to its first process only."""
    if not isinstance(value, dict) or set(value) - {"number", "before", "batch"}:
        raise ProtocolError("signal must be an object with number, before and batch")
    return (
        _int(value.get("number"), "signal.number", 1, 64),
        _number(value.get("before", 60), "signal.before", 0.0, MAX_TIME),
        _bool(value.get("batch", False), "signal.batch"),
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


def listing(message: Mapping[str, Any]) -> Listing:
    ids = message.get("ids")
    return Listing(
        limit=_int(message.get("limit", PAGE_ROWS), "limit", 1, MAX_PAGE_ROWS),
        offset=_int(message.get("offset", 0), "offset", 0, 2**62),
        user=_optional(message.get("user"), _string, "user", 256),
        ids=job_ids(ids, "ids") if ids is not None else (),
        arrays=_bool(message.get("arrays", False), "arrays"),
    )


@record
class Report:
    """A `report` request: GPU usage between `since` and `until` (seconds since the
    epoch), grouped `by` user, group, account or job, `per` day, week, month or all;
    with `waste`, the GPU-hours held idle instead (gpuwarden.usage)."""

    since: float
    until: float
    by: str = "user"
    per: str = "all"
    waste: bool = False


def report(message: Mapping[str, Any]) -> Report:
    from gpuwarden.usage import BY, PER

    since = _number(message.get("since"), "since", 0.0, 1e11)
    until = _number(message.get("until"), "until", 0.0, 1e11)
    if until <= since:
        raise ProtocolError("until must be after since")
    by = _string(message.get("by", "user"), "by", 20)
    per = _string(message.get("per", "all"), "per", 20)
    if by not in BY:
        raise ProtocolError(f"by must be one of {', '.join(BY)}")
    if per not in PER:
        raise ProtocolError(f"per must be one of {', '.join(PER)}")
    return Report(since, until, by, per, _bool(message.get("waste", False), "waste"))


def eff_jobs(message: Mapping[str, Any]) -> tuple[int, ...]:
    """The jobs an `eff` request names (`"jobs": [...]`), at most 100."""
    ids = job_ids(message.get("jobs"))
    if len(ids) > 100:
        raise ProtocolError("eff: at most 100 jobs at once")
    return ids


def _bool(value: object, name: str) -> bool:
    if not isinstance(value, bool):
        raise ProtocolError(f"{name} must be true or false")
    return value


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
    number = _int(value, "signal", 1, 64)
    if number not in allowed:
        raise ProtocolError(f"signal {number} may not be sent to a job")
    return number


# The field checks, for the requests other modules serve (service.bookings).
checked_int, checked_number, checked_string = _int, _number, _string
