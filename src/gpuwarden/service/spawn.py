"""Starting a job as its owner, and learning how it ended even across a service restart.

The service (root) forks a supervisor per job. The supervisor starts a session of
its own, so it and the job outlive the service if it is killed, and forks the job,
which drops to its owner before anything it does can be steered by the owner:

0. (the supervisor, as root, has made the job's cgroup, `service.jobcgroup`, in which
   only its leased GPUs can be opened) the job joins it, so all it starts does too;
1. `setgroups` (every group of the owner's, as `initgroups` gives: setting uid and
   gid alone would keep root's supplementary groups), then `setgid`, then `setuid`;
   a uid other than 0 must then be unable to get root back, or the job is not run;
2. the owner's umask and working directory (`chdir` as the owner: a directory the
   owner may not enter is refused as it would be in their shell);
3. the output file, opened as the owner, so a symlink the owner planted can never
   make the service write where the owner could not;
4. `exec` with the owner's environment less the variables the service controls.

The supervisor, not the job, holds the lease lock descriptors (`JobStart.keep`): a job
has no descriptor to pass to a process outside it (SCM_RIGHTS) that would keep its
GPUs. The supervisor is the job tree's subreaper (`service.tree`); when the job's
own process ends it kills what is left below it, then lets go of the leases by
exiting: the leases live exactly as long as the job's process tree. A failure
before `exec` reaches the supervisor through a close-on-exec pipe (empty at a
successful exec). The supervisor then reports the job's pid, waits for it,
writes its exit status atomically into the service's status directory, where a
restarted service finds it, and tells the service the job has ended (the report
pipe's end-of-file) before that record's fsync and its own exit.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Optional

from gpuwarden.base.errors import UserError
from gpuwarden.service import becoming, exitrecord, jobprocess, jobterminal, staging, tree
from gpuwarden.service.identity import Person
from gpuwarden.service.marker import MARKER_SUFFIX as MARKER_SUFFIX  # the callers' names
from gpuwarden.service.marker import marker_path as marker_path
from gpuwarden.service.marker import name_marker, write_marker
from gpuwarden.service.marker import read_marker as read_marker

TYPE_CHECKING = False
if TYPE_CHECKING:
    from gpuwarden.service.jobcgroup import Place

#: Seconds a supervisor has to report the job's pid (or why it could not start).
REPORT_WITHIN = 30.0


@dataclass(frozen=True)
class JobStart:
    """Everything needed to start one job; built by the service from a validated request."""

    job: str
    argv: tuple[str, ...]
    owner: Person
    cwd: str
    env: Mapping[str, str]
    status_dir: str  # the service's own directory: exit records go here
    umask: int = 0o022
    output: Optional[str] = None  # stdout+stderr appended here (opened as the owner)
    stdio: Optional[tuple[int, int, int]] = None  # an attached client's descriptors
    keep: tuple[int, ...] = ()  # lease descriptors the supervisor holds for the job
    extra_env: Mapping[str, str] = field(default_factory=dict)  # set by the service
    # Device isolation: the leased GPUs' minors (None: not asked for), the machine's GPU
    # minors, and `enforce.devices` (auto: where possible; require: else not run; off).
    minors: Optional[tuple[Optional[int], ...]] = None
    present: tuple[int, ...] = ()
    devices: str = "auto"
    caps: Optional[tuple[int, tuple[int, ...]]] = None  # other MIG slices' caps nodes to deny


@dataclass(frozen=True)
class Started:
    """A running job: its supervisor (whose end means the exit record is written) and
    the job's own pid, which is also its process group (signals go to the group)."""

    supervisor: int
    pid: int


def start_time(pid: Optional[int] = None) -> int:
    """A process's start time in clock ticks since boot (/proc/PID/stat field 22):
    with the pid, it names one process even after the pid is reused."""
    try:  # os.open, not open(): 3 system calls, not 8, in every supervisor and restart
        fd = os.open(f"/proc/{pid or 'self'}/stat", os.O_RDONLY | os.O_CLOEXEC)
        try:
            text = os.read(fd, 4096).decode("ascii", "replace")
        finally:
            os.close(fd)
        return int(text.rsplit(")", 1)[1].split()[19])
    except (OSError, ValueError, IndexError):
        return -1


def alive(pid: int, since: int) -> bool:
    """Whether the process `pid` that started at `since` still exists (not a reuse)."""
    return since >= 0 and start_time(pid) == since


@dataclass
class Forked:
    """A supervisor given the go-ahead: its pid, and the read end of the pipe its report
    (the job's pid once it has exec'd, or why it could not start) comes on, one line
    (`report_of`). After a pid the pipe stays open: its end-of-file is the job's end,
    told once the exit record is written and the leases let go (or the supervisor
    died), before the supervisor's own exit."""

    supervisor: int
    report: int
    go: int = -1  # the write end of its go-ahead pipe, while `begin(go=False)` kept it
    pidfd: int = -1  # the supervisor's, when another process forked it (the caller's to close)


def begin(
    launch: JobStart,
    on_forked: Optional[Callable[[int, int], None]] = None,
    go: bool = True,
    forker: Optional[Callable[[JobStart, int, int], tuple[int, int, int]]] = None,
) -> Forked:
    """Fork the supervisor and give it the go-ahead; return at once, before the job
    has set itself up (the caller reads the report when it comes: `report_of`).

    `on_forked(supervisor pid, its start time)` runs before the supervisor may start
    the job: the service records the supervisor there. The supervisor waits for a
    go-ahead on a pipe, and a service that dies before giving it leaves a supervisor
    that reads end-of-file and exits without running anything — so a job the
    journal does not know to be starting never runs, and none runs twice.
    `go=False`: the go-ahead is the caller's to give (`go_ahead`), once what
    `on_forked` wrote is durable: the starts of one pass share one fsync.
    `forker`: forks the supervisor in another process (service.forker's `Forker.fork`:
    its pid, start time and pidfd; `Forked.pidfd` names it then, the caller's to close).
    """
    if not launch.argv or not launch.argv[0]:
        raise UserError("empty command")
    report_r, report_w = os.pipe2(os.O_CLOEXEC)
    go_r, go_w = os.pipe2(os.O_CLOEXEC)
    pidfd = -1
    if forker is not None:
        try:
            pid, since, pidfd = forker(launch, report_w, go_r)
        except BaseException:
            for fd in (report_r, report_w, go_r, go_w):
                os.close(fd)
            raise
    else:
        where = _ready(launch)
        pid = os.fork()
        if pid == 0:  # the supervisor
            code = 70
            try:
                os.close(report_r)
                os.close(go_w)
                code = _supervise(launch, report_w, go_r, where)
            finally:
                os._exit(code)
        since = start_time(pid)  # it exists: it waits for the go-ahead
    os.close(go_r)
    os.close(report_w)
    try:
        if on_forked is not None:
            on_forked(pid, since)
    except BaseException:
        os.close(report_r)
        os.close(go_w)  # its supervisor reads end-of-file: it runs nothing
        if pidfd >= 0:
            os.close(pidfd)
        raise
    forked = Forked(pid, report_r, go_w, pidfd)
    if go:
        go_ahead(forked)
    return forked


def go_ahead(forked: Forked, run: bool = True) -> None:
    """Let `forked`'s supervisor start its job (`run=False`: tell it to exit without
    running anything, as a service that died before the go-ahead does)."""
    if forked.go < 0:
        return
    try:
        if run:
            os.write(forked.go, b"g")
    finally:
        os.close(forked.go)
        forked.go = -1


def report_of(
    job: str, supervisor: int, message: bytes, timeout: float = REPORT_WITHIN, pidfd: int = -1
) -> Started:
    """The started job from its supervisor's whole report, or UserError with the reason
    it could not start (its supervisor gone: it exits once it has said so; reaped where
    it is this process's child, waited for through `pidfd` where one is given)."""
    try:
        report = json.loads(message or b"{}")
    except ValueError:
        report = {}
    if not isinstance(report, dict):
        report = {}
    if report.get("error"):
        _reap(supervisor, timeout, pidfd)
        raise UserError(f"job {job} could not start: {report['error']}")
    if not isinstance(report.get("pid"), int):
        _reap(supervisor, timeout, pidfd)
        raise UserError(f"job {job} could not start: its supervisor died")
    return Started(supervisor=supervisor, pid=report["pid"])


def start(
    launch: JobStart,
    timeout: float = REPORT_WITHIN,
    on_forked: Optional[Callable[[int, int], None]] = None,
) -> Started:
    """`begin`, then wait for the report: return once the job has exec'd (or raise
    UserError with the reason it could not start, after recording it). The service
    does not wait (service.starting); this is for a caller with nothing else to do."""
    forked = begin(launch, on_forked)
    try:
        message = _read_all(forked.report, timeout, until=b"\n")
    finally:
        os.close(forked.report)
    return report_of(launch.job, forked.supervisor, message, timeout)


def _read_all(fd: int, timeout: float, until: Optional[bytes] = None) -> bytes:
    """What comes on `fd` up to its end-of-file (or up to `until`, a report's end)."""
    deadline = time.monotonic() + timeout
    chunks: list[bytes] = []
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            raise UserError("a job's supervisor did not answer in time")
        ready, _, _ = select.select([fd], [], [], left)
        if not ready:
            continue
        chunk = os.read(fd, 65536)
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)
        if until is not None and until in chunk:
            return b"".join(chunks)


def _reap(pid: int, timeout: float, pidfd: int = -1) -> None:
    if pidfd >= 0:
        jobprocess.exited(pidfd, timeout)
        return
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            done, _ = os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            return
        if done:
            return
        time.sleep(0.01)


def _supervise(
    launch: JobStart,
    report_w: int,
    go_r: int,
    where: Optional[Place],
    become: bool = True,
    staged: Optional[staging.Staged] = None,
) -> int:
    """In the supervisor: start the job, report its pid, wait, write its exit record.

    All that may come before the go-ahead does, while the service commits the start:
    the job's cgroup, its fork and its own steps up to the exec (it then waits for a
    byte), the exit record's room and the marker's data. After the go-ahead only the
    marker's name is given before the job execs (a rename: no disk wait). `become=False`,
    `staged`: `becoming.become_supervisor` was done, and the room and the marker's data
    made in `launch.status_dir`, before the launch came (a spare, service.forker)."""
    if become:
        becoming.become_supervisor({report_w, go_r, *launch.keep, *(launch.stdio or ())})
    if launch.stdio is not None:
        jobterminal.take(launch.stdio[0])
    cgroup, problem = _job_cgroup(launch, where)
    job, exec_w, error_r = -1, -1, -1
    if problem is None:
        error_r, error_w = os.pipe2(os.O_CLOEXEC)
        exec_r, exec_w = os.pipe2(os.O_CLOEXEC)  # a byte: the marker is named, exec
        job = os.fork()
        if job == 0:
            try:
                os.close(error_r)
                os.close(report_w)
                os.close(go_r)
                os.close(exec_w)
                becoming.become_job(launch, error_w, cgroup, exec_r)  # only returns by raising
            except BaseException as err:  # report any failure, then exit: never run on as root
                text = err.args[0] if isinstance(err, UserError) else _describe(err)
                try:
                    os.write(error_w, str(text).encode("utf-8", "replace")[:4000])
                finally:
                    os._exit(127)
        os.close(error_w)
        os.close(exec_r)
    # The exit record's room and the marker's data (a spare's made before its launch)
    # while the job sets itself up: only the marker's name says a job may have run.
    room = exitrecord.reserve_path(launch.status_dir, launch.job)
    marker, unstarted = None, None  # the reason the job is not run, if one
    try:
        staged = staged or staging.stage(launch.status_dir, os.getpid(), start_time())
        marker = staged.take(launch.job)
    except UserError as err:  # no room (a full disk): not run
        unstarted = str(err)
    go = os.read(go_r, 1)
    os.close(go_r)
    if go != b"g" or unstarted is not None:
        # The service died before recording us (the job must not run), or the disk
        # cannot take the job's records: the job ends at its closed pipe, unrun.
        _unstart(job, exec_w, cgroup, [room, marker])
        if go == b"g":
            os.write(report_w, _report(0, unstarted))
            os.close(report_w)
        return 0
    assert staged is not None and marker is not None
    if problem is not None:  # no cgroup where one is required: recorded, not run
        with contextlib.suppress(UserError):
            name_marker(launch.status_dir, launch.job, marker)
        record = {"code": None, "signal": None, "error": problem, "at": time.time()}
        _write_exit_record(launch, record)
        os.write(report_w, _report(0, problem))
        os.close(report_w)
        return 0
    # Named before the job execs: a restarted service that finds no marker for a job of
    # this boot knows it never ran and may queue it again without running it twice.
    try:
        name_marker(launch.status_dir, launch.job, marker)
        os.write(exec_w, b"x")
    except UserError:
        pass  # closed without the byte: the job exits before its exec, saying why
    except BrokenPipeError:
        pass  # the job failed before its exec (its error is on `error_r`)
    finally:
        os.close(exec_w)
    failure = _read_all(error_r, 60.0).decode("utf-8", "replace")
    os.close(error_r)
    with contextlib.suppress(BrokenPipeError):  # the service died; a restart adopts us
        os.write(report_w, _report(job, failure or None))
    if failure:
        os.close(report_w)  # nothing ran: the report is all there is
        report_w = -1
    # The job's pid here too, for a restart; the report above and the journal have it
    # as well, so a full disk now must not end the supervisor of a running job. After
    # the report: the service starts the next job meanwhile, not after these writes.
    # Not waited onto the disk: it is for a restarted service, which a crash of the
    # machine does not need it for (the job died with the machine).
    with contextlib.suppress(UserError):
        write_marker(launch.status_dir, launch.job, {**staged.mark, "pid": job}, durable=False)
    while True:
        try:
            _, status = os.waitpid(job, 0)
            break
        except InterruptedError:
            continue
    tree.end_tree()  # before the exit record: the leases go when we exit, after it
    if failure:
        record = {"code": None, "signal": None, "error": failure, "at": time.time()}
    elif os.WIFSIGNALED(status):
        record = {"code": None, "signal": os.WTERMSIG(status), "error": None, "at": time.time()}
    else:
        record = {"code": os.WEXITSTATUS(status), "signal": None, "error": None, "at": time.time()}

    # The end, told as soon as its record is named (the report pipe's end-of-file, the
    # service's event), before the record's fsync and our exit: neither is on the way
    # from a freed GPU to the next start. The leases go first: the service frees the
    # GPUs as it reads the end, and a lock still held would keep them.
    def told() -> None:
        for fd in (*launch.keep, report_w):
            if fd >= 0:
                with contextlib.suppress(OSError):
                    os.close(fd)

    _write_exit_record(launch, record, told)
    return 0


def _report(pid: int, error: Optional[str]) -> bytes:
    """The supervisor's report, one line: the job's pid, or why it could not start."""
    return json.dumps({"pid": pid, "error": error}).encode() + b"\n"


def _unstart(job: int, exec_w: int, cgroup: dict[str, str], files: list[Optional[str]]) -> None:
    """Undo what was made for a job that is not run: its process (waiting for a byte
    it will not get) ends and is reaped, then its cgroup and `files` go."""
    if job > 0:
        os.close(exec_w)
        with contextlib.suppress(ChildProcessError):
            os.waitpid(job, 0)
    if cgroup:
        from gpuwarden.service.jobcgroup import remove_job

        remove_job(cgroup)
    for path in files:
        if path is not None:
            with contextlib.suppress(OSError):
                os.unlink(path)


def _write_exit_record(
    launch: JobStart, record: Mapping[str, object], told: Optional[Callable[[], None]] = None
) -> None:
    room = exitrecord.reserve_path(launch.status_dir, launch.job)
    path = exitrecord.exit_record_path(launch.status_dir, launch.job)
    exitrecord.write(room, path, record, told)


def _ready(launch: JobStart, placed: Optional[tuple[str, Place]] = None) -> Optional[Place]:
    """In the service, before it forks a supervisor: load and work out what the
    supervisor and the job call (the C library's handle, the cgroups' place and the
    modules it needs), once here rather than in each of them, where every lazy import
    or reading of /proc would be paid again per job. The job's cgroup `Place`, or None.
    `placed`: a status directory and its place, worked out before the launch came."""
    tree.ready()
    if launch.minors is None or launch.devices == "off":
        return None
    if placed is not None and placed[0] == launch.status_dir:
        return placed[1]
    from gpuwarden.service import jobcgroup

    return jobcgroup.place(launch.status_dir)


def _job_cgroup(launch: JobStart, where: Optional[Place]) -> tuple[dict[str, str], Optional[str]]:
    """The job's cgroup dirs, made and confined to its GPUs by the supervisor (root); or
    no cgroup, with the reason the job must not run when `devices` is "require"."""
    if where is None:
        return {}, None
    from gpuwarden.cgroups.devices import CgroupError  # loaded: `_ready` loaded jobcgroup
    from gpuwarden.service import jobcgroup

    try:
        minors = launch.minors or ()
        return jobcgroup.make_job(where, launch.job, minors, launch.present, launch.caps), None
    except CgroupError as err:
        if launch.devices == "require":
            return {}, f"{err} (enforce.devices = require)"
        if where.mode != "none":
            import logging

            logging.getLogger("gpuwarden.serve").warning(
                "job %s runs without device isolation: %s", launch.job, err
            )
        return {}, None


def _describe(err: BaseException) -> str:
    if isinstance(err, OSError) and err.strerror:
        where = f" {err.filename}" if err.filename else ""
        return f"{err.strerror}{where}"
    return f"{type(err).__name__}: {err}"


def signal_job(started_pid: int, sig: int) -> bool:
    """Send `sig` to the job's process group; False when it is gone already."""
    try:
        os.killpg(started_pid, sig)
    except ProcessLookupError:
        return False
    return True


def wait_supervisor(supervisor: int, timeout: Optional[float] = None) -> bool:
    """Reap the supervisor if it is our child and has ended (True), without blocking
    past `timeout` (None: block)."""
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        try:
            pid, _ = os.waitpid(supervisor, 0 if timeout is None else os.WNOHANG)
        except ChildProcessError:
            return True
        if pid:
            return True
        if deadline is not None and time.monotonic() >= deadline:
            return False
        time.sleep(0.005)


def argv_of(value: object) -> Sequence[str]:
    """A command from a request: a non-empty list of strings without NUL bytes."""
    if not isinstance(value, list) or not value or not all(isinstance(a, str) for a in value):
        raise UserError("a command is a non-empty list of strings")
    if not value[0] or any("\0" in a for a in value):
        raise UserError("a command's words must be non-empty and contain no NUL byte")
    return value
