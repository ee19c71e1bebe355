"""Slurm's own commands, called with fixed arguments and read in fixed text formats.

Formats are requested explicitly and the variables that would change them
(SQUEUE_FORMAT, SLURM_TIME_FORMAT, ...) are removed, so a user's defaults never
change what is parsed. `--json` is not used: its schema changed between Slurm
versions (a job's state became a list in 23.11). Each failure becomes one line
carrying Slurm's own text.
"""

from __future__ import annotations

import contextlib
import os
import time

from gpuwarden.base.errors import UserError
from gpuwarden.base.units import is_digits
from gpuwarden.slurm.batch import REQUIRED, Value
from gpuwarden.slurm.states import ENDED, reason_word, state_word

TYPE_CHECKING = False  # typing and re are not imported on `submit --slurm`'s path
if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence
    from typing import Optional

# Variables that change squeue/scontrol/sinfo output.
_FORMAT_VARIABLES = (
    "SQUEUE_FORMAT",
    "SQUEUE_FORMAT2",
    "SQUEUE_SORT",
    "SQUEUE_USERS",
    "SQUEUE_STATES",
    "SQUEUE_PARTITION",
    "SQUEUE_ACCOUNT",
    "SQUEUE_NAMES",
    "SQUEUE_QOS",
    "SQUEUE_ALL",
    "SQUEUE_ARRAY",
    "SQUEUE_PRIORITY",
    "SINFO_FORMAT",
    "SINFO_SORT",
    "SLURM_TIME_FORMAT",
    "SLURM_CLUSTERS",
)
# `%i|...|%j`: the name goes last, as the only field that may hold the separator.
SQUEUE_FORMAT = "%i|%u|%T|%r|%M|%l|%D|%b|%N|%j"
_FIELD = r"(?:^| )([A-Za-z][A-Za-z0-9_:/]*)=(.*?)(?= [A-Za-z][A-Za-z0-9_:/]*=|$)"
TIMEOUT = 60.0


class SlurmJob(Value):
    """One job as `gpuwarden queue --slurm` shows it: `state` in the queue's words
    (pending, running, done, ...), `reason` why it waits (Resources, ...; "" when none),
    `gres` like gpu:2, and `slurm_state` as Slurm said it."""

    FIELDS = tuple(
        (name, REQUIRED)
        for name in (
            "id",
            "user",
            "state",
            "reason",
            "elapsed",
            "limit",
            "nodes",
            "gres",
            "nodelist",
            "name",
            "slurm_state",
        )
    )
    if TYPE_CHECKING:
        id: str
        user: str
        state: str
        reason: str
        elapsed: str
        limit: str
        nodes: int
        gres: str
        nodelist: str
        name: str
        slurm_state: str


def clean_env(environ: Optional[Mapping[str, str]] = None) -> dict[str, str]:
    env = dict(os.environ if environ is None else environ)
    for name in _FORMAT_VARIABLES:
        env.pop(name, None)
    return env


class Done:
    """What a finished Slurm command left: exit status and its two streams."""

    def __init__(self, returncode: int, stdout: str, stderr: str) -> None:
        self.returncode = returncode
        self.stdout = stdout
        self.stderr = stderr


def spawn(argv: Sequence[str], stdin: Optional[str], env: dict[str, str], timeout: float) -> Done:
    """Run a program with `stdin` as its input and both outputs captured, through
    posix_spawn and select rather than `subprocess`, whose import (threading,
    selectors, signal, locale) is the largest share of what `submit --slurm` adds to
    sbatch's own time. Raises FileNotFoundError and TimeoutError."""
    import select

    r_in, w_in = os.pipe()
    r_out, w_out = os.pipe()
    r_err, w_err = os.pipe()
    try:
        pid = os.posix_spawnp(
            argv[0],
            list(argv),
            env,
            file_actions=[
                (os.POSIX_SPAWN_DUP2, r_in, 0),
                (os.POSIX_SPAWN_DUP2, w_out, 1),
                (os.POSIX_SPAWN_DUP2, w_err, 2),
            ],
        )
    except BaseException:
        for fd in (r_in, w_in, r_out, w_out, r_err, w_err):
            os.close(fd)
        raise
    for fd in (r_in, w_out, w_err):
        os.close(fd)
    data = (stdin or "").encode()
    chunks: dict[int, list[bytes]] = {r_out: [], r_err: []}
    open_fds = [r_out, r_err]
    writing = [w_in] if data else []
    if not data:
        os.close(w_in)
    deadline = time.monotonic() + timeout
    try:
        while open_fds or writing:
            left = deadline - time.monotonic()
            if left <= 0:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, 9)
                raise TimeoutError
            readable, writable, _ = select.select(open_fds, writing, [], left)
            for fd in writable:
                try:
                    sent = os.write(fd, data[:65536])
                except BrokenPipeError:
                    sent = len(data)
                data = data[sent:]
                if not data:
                    os.close(fd)
                    writing = []
            for fd in readable:
                chunk = os.read(fd, 65536)
                if chunk:
                    chunks[fd].append(chunk)
                else:
                    open_fds.remove(fd)
                    os.close(fd)
    finally:
        for fd in open_fds + writing:
            os.close(fd)
        _, status = os.waitpid(pid, 0)
    code = os.waitstatus_to_exitcode(status)
    out, err = (b"".join(chunks[fd]).decode(errors="replace") for fd in (r_out, r_err))
    return Done(code, out, err)


def call(argv: Sequence[str], *, stdin: Optional[str] = None, timeout: float = TIMEOUT) -> Done:
    """Run a Slurm command; its missing program or failure is one line with its text."""
    try:
        done = spawn(argv, stdin, clean_env(), timeout)
    except FileNotFoundError:
        raise UserError(
            f"{argv[0]} not found on PATH: install Slurm's client commands (Debian: "
            "slurm-client) or run where they are"
        ) from None
    except TimeoutError:
        raise UserError(f"{argv[0]} did not answer within {timeout:.0f} s") from None
    if done.returncode != 0:
        raise UserError(f"{argv[0]} failed: {slurm_text(done.stderr or done.stdout, argv[0])}")
    return done


def slurm_text(output: str, program: str) -> str:
    """Slurm's error lines as one line: `sbatch: error: X` -> `X`; several joined by `; `."""
    lines = []
    for raw in output.splitlines():
        line = raw.strip()
        for prefix in (f"{program}: error: ", f"{program}: fatal: ", "error: ", f"{program}: "):
            if line.startswith(prefix):
                line = line[len(prefix) :]
                break
        if line and line not in lines:
            lines.append(line)
    return "; ".join(lines) or "no message"


def submit(script: str) -> str:
    """`sbatch --parsable` reading the script on stdin; the job id."""
    done = call(["sbatch", "--parsable"], stdin=script)
    return parse_submitted(done.stdout)


def parse_submitted(stdout: str) -> str:
    """`--parsable` prints `ID` or `ID;CLUSTER`."""
    text = stdout.strip().splitlines()[-1] if stdout.strip() else ""
    job = text.split(";", 1)[0].strip()
    if not is_job_id(job):
        raise UserError(f"sbatch printed no job id (it printed {stdout.strip()[:200]!r})")
    return job


def parse_queue(stdout: str) -> list[SlurmJob]:
    """squeue -h -o SQUEUE_FORMAT, one job a line."""
    jobs = []
    for line in stdout.splitlines():
        if not line.strip():
            continue
        fields = line.split("|", 9)
        if len(fields) != 10:
            continue  # not ours (a warning line)
        jid, user, state, reason, elapsed, limit, nodes, gres, nodelist, name = fields
        word = state_word(state)
        if word == "running" and reason.strip() == "Prolog":
            word = "starting"  # allocated, its prolog still running: nothing of it runs yet
        jobs.append(
            SlurmJob(
                id=jid,
                user=user,
                state=word,
                reason=reason_word(reason) if word in ("pending", "starting") else "",
                elapsed=elapsed,
                limit=limit,
                nodes=int(nodes) if is_digits(nodes) else 0,
                gres=_gres_word(gres),
                nodelist=nodelist,
                name=name,
                slurm_state=state,
            )
        )
    return jobs


def _gres_word(gres: str) -> str:
    """`gres:gpu:2` (22.05's %b) or `gres/gpu:2` -> `gpu:2`; N/A and (null) -> ``."""
    text = gres.strip()
    if text in ("N/A", "(null)", ""):
        return ""
    parts = [p.split("gres:", 1)[-1].split("gres/", 1)[-1] for p in text.split(",")]
    return ",".join(parts)


def queue(user: Optional[str] = None, jobs: Sequence[str] = ()) -> list[SlurmJob]:
    """Every job the controller still knows, ended ones included (`-t all`: Slurm keeps
    them for `MinJobAge`, 300 s by default), as `squeue -t all` lists them."""
    argv = ["squeue", "-h", "-t", "all", "-o", SQUEUE_FORMAT]
    if user:
        argv += ["-u", user]
    if jobs:
        argv += ["-j", ",".join(jobs)]
    return parse_queue(call(argv).stdout)


def is_job_id(text: str) -> bool:
    """`1234`, or `1234_5` (an array task)."""
    job, sep, task = text.partition("_")
    return is_digits(job) and (not sep or is_digits(task))


def check_id(job: str) -> str:
    if not is_job_id(job):
        raise UserError(f"invalid Slurm job id {job!r}: expected a number such as 1234")
    return job


def show_job(job: str) -> dict[str, str]:
    """`scontrol show job -o ID` as a dict (StdOut, UserId, JobState, ...)."""
    check_id(job)
    try:
        done = call(["scontrol", "show", "job", "-o", job])
    except UserError as err:
        if "Invalid job id" in str(err):
            raise UserError(
                f"Slurm knows no job {job} (it never existed, or ended longer ago than "
                "the controller's MinJobAge)"
            ) from None
        raise
    return parse_show(done.stdout)


def parse_show(stdout: str) -> dict[str, str]:
    """scontrol's one-line `Key=Value Key=Value`; a value may hold spaces (a command,
    a path), so a field ends only where the next ` Key=` starts."""
    line = stdout.strip().splitlines()[0] if stdout.strip() else ""
    out: dict[str, str] = {}
    import re

    for m in re.finditer(_FIELD, line):
        out.setdefault(m.group(1), m.group(2))
    return out


def cancel(job: str) -> None:
    check_id(job)
    try:
        known = queue(jobs=[job])
    except UserError as err:
        if "Invalid job id" not in str(err):
            raise
        known = []
    if not known or all(j.state in ENDED for j in known):
        raise UserError(f"no Slurm job {job} is pending or running")
    call(["scancel", job])


def drain_node(node: str, reason: str) -> None:
    """Take the node out of Slurm's scheduling until an admin resumes it: running jobs
    finish, no new one starts (`scontrol update ... State=DRAIN`)."""
    from gpuwarden.slurm.batch import WORD

    if not node or not all(c in WORD or c in "[]," for c in node):
        raise UserError(f"invalid Slurm node name {node!r}")
    reason = " ".join(reason.split())[:200] or "gpuwarden: GPU fault"
    call(["scontrol", "update", f"NodeName={node}", "State=DRAIN", f"Reason={reason}"])
