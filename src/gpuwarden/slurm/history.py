"""Ended Slurm jobs for `gpuwarden jobs --slurm`, in the shape of the local history.

Where slurmdbd runs, `sacct` is the record (it keeps every job); small sites often run
none (`AccountingStorageType=accounting_storage/none`, where sacct answers "Slurm
accounting storage is disabled"), and there the controller's own memory is all
there is: `scontrol show job`, which keeps an ended job for `MinJobAge` seconds. Both
are read in fixed formats and mapped to the keys `gpuwarden.cli.jobtables.history_table`
reads (id, user, state, exit_code, signal, count, elapsed, ended, command), so a user
reads the same columns whichever scheduler ran the job.
"""

from __future__ import annotations

import time
from typing import Any, Optional

from gpuwarden.base.errors import UserError
from gpuwarden.base.units import is_digits
from gpuwarden.slurm import tools
from gpuwarden.slurm.states import ENDED, state_word

# -X: the allocation only, not each step; -P: `|`-separated; JobName last (it may hold `|`).
SACCT_FORMAT = "JobID,User,State,ExitCode,ElapsedRaw,End,AllocTRES,JobName"
SACCT_STATES = "CA,CD,DL,F,NF,OOM,PR,TO,BF"
NO_ACCOUNTING = "accounting storage is disabled"


def seconds(text: str) -> Optional[float]:
    """Slurm's `[D-]HH:MM:SS` (or `MM:SS`) -> seconds; None when unknown."""
    days, _, rest = text.strip().rpartition("-")
    parts = rest.split(":")
    if not all(is_digits(p) for p in parts) or not 1 <= len(parts) <= 3:
        return None
    total = 0
    for p in parts:
        total = total * 60 + int(p)
    if days:
        if not is_digits(days):
            return None
        total += int(days) * 86400
    return float(total)


def epoch(text: str) -> Optional[float]:
    """Slurm's local `2026-12-02T13:55:25` -> epoch seconds; None for Unknown/None."""
    try:
        return float(time.mktime(time.strptime(text.strip(), "%Y-%m-%dT%H:%M:%S")))
    except ValueError:
        return None


def _exit(text: str) -> tuple[Optional[int], Optional[int]]:
    """`ExitCode=1:0` -> (1, None); `0:15` -> (None, 15) (killed by signal 15)."""
    code, _, sig = text.partition(":")
    if not is_digits(code) or not is_digits(sig):
        return None, None
    if int(sig):
        return None, int(sig)
    return int(code), None


def _gpus_in(tres: str) -> int:
    """`cpu=1,gres/gpu=2,node=1` or `gres:gpu:2` (per node) -> 2; 0 when none named."""
    for part in tres.split(","):
        key, _, value = part.replace("gres:gpu:", "gres/gpu=").partition("=")
        if key.strip() == "gres/gpu" and is_digits(value.rpartition(":")[2]):
            return int(value.rpartition(":")[2])
    return 0


def _job(
    jid: str, user: str, state: str, code: str, elapsed: Optional[float], end: str, gpus: int
) -> dict[str, Any]:
    exit_code, signal = _exit(code)
    return {
        "id": jid,
        "user": user,
        "state": state_word(state),
        "exit_code": exit_code,
        "signal": signal,
        "count": gpus,
        "elapsed": elapsed,
        "ended": epoch(end),
    }


def parse_sacct(stdout: str) -> list[dict[str, Any]]:
    jobs = []
    for line in stdout.splitlines():
        fields = line.split("|", 7)
        if len(fields) != 8:
            continue
        jid, user, state, code, elapsed, end, tres, name = fields
        raw = float(elapsed) if is_digits(elapsed) else None
        job = _job(jid, user, state, code, raw, end, _gpus_in(tres))
        job["command"] = [name]
        jobs.append(job)
    return jobs


def parse_scontrol(stdout: str) -> list[dict[str, Any]]:
    """`scontrol show job -o` with no id: every job the controller keeps, one a line."""
    jobs = []
    for line in stdout.splitlines():
        if not line.startswith("JobId="):
            continue
        f = tools.parse_show(line)
        user = f.get("UserId", "").partition("(")[0]
        nodes = int(f["NumNodes"]) if is_digits(f.get("NumNodes", "")) else 1
        gpus = _gpus_in(f.get("TresPerNode", "")) * nodes or _gpus_in(f.get("TRES", ""))
        job = _job(
            f.get("JobId", "?"),
            user,
            f.get("JobState", ""),
            f.get("ExitCode", ""),
            seconds(f.get("RunTime", "")),
            f.get("EndTime", ""),
            gpus,
        )
        command = f.get("Command", "")
        job["command"] = [command if command not in ("", "(null)") else f.get("JobName", "")]
        jobs.append(job)
    return jobs


def ended_jobs(user: Optional[str], last: int) -> tuple[list[dict[str, Any]], str]:
    """(the last `last` ended jobs, newest first, and where they came from: `sacct` or
    `scontrol`)."""
    # -E as well as -S: with -s, sacct (22.05) ends the window at its start unless told,
    # and lists nothing (tests/test_slurm_cluster_real.py, on a real slurmdbd)
    argv = ["sacct", "-X", "-n", "-P", "-S", "now-30days", "-E", "now", "-s", SACCT_STATES]
    argv += ["-o", SACCT_FORMAT] + (["-u", user] if user else ["-a"])
    try:
        jobs, source = parse_sacct(tools.call(argv).stdout), "sacct"
    except UserError as err:
        if NO_ACCOUNTING not in str(err):
            raise
        done = tools.call(["scontrol", "show", "job", "-o"])
        jobs, source = parse_scontrol(done.stdout), "scontrol"
        if user:
            jobs = [j for j in jobs if j["user"] == user]
    jobs = [j for j in jobs if j["state"] in ENDED]
    jobs.sort(key=lambda j: -(j["ended"] or 0.0))
    return jobs[:last], source
