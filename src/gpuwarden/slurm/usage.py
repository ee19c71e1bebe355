"""`gpuwarden report --slurm`: Slurm's accounting in the columns of the local report.

`sacct -a -X -D` lists every allocation (`-X`: not its steps) in the window, with
every run of a requeued job (`-D`, `--duplicates`), as the service's journal keeps
them; each run's GPUs come from its AllocTRES (`gres/gpu=N`), its wait from Submit
(Eligible when it was held) to Start. A running job counts until now. The rows go
through the same `gpuwarden.usage.report.summarise` as the local journal's, so a lab's
figures carry on after it moves to Slurm. Where Slurm keeps no accounting
(`accounting_storage/none`), the controller's memory of recent jobs (`scontrol show
job`) is all there is, and the report says so on stderr.
"""

from __future__ import annotations

import sys
import time
from typing import Optional

from gpuwarden.base.errors import UserError
from gpuwarden.slurm import tools
from gpuwarden.slurm.history import NO_ACCOUNTING, _gpus_in, epoch
from gpuwarden.usage import report as usage

# -P: `|`-separated; no free text, so no field holds `|`.
FORMAT = "JobID,User,Group,Account,Submit,Eligible,Start,End,AllocTRES"


def _stamp(seconds: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(seconds))


def parse(stdout: str, now: float) -> list[usage.Run]:
    """`sacct -P -n -o FORMAT` lines -> runs (those that started and held GPUs)."""
    runs = []
    for line in stdout.splitlines():
        fields = line.split("|")
        if len(fields) != 9:
            continue
        jid, user, group, account, submit, eligible, start, end, tres = fields
        started = epoch(start)
        gpus = _gpus_in(tres)
        if started is None or not gpus:
            continue
        ended = epoch(end)
        finished = now if ended is None else ended
        queued = max(x for x in (epoch(submit), epoch(eligible), 0.0) if x is not None)
        runs.append(
            usage.Run(
                jid,
                user,
                group,
                account or None,
                gpus,
                gpus * max(0.0, finished - started),
                min(queued, started) if queued else started,
                started,
                max(started, finished),
            )
        )
    return runs


def runs(since: float, until: float, now: Optional[float] = None) -> list[usage.Run]:
    """Every run that held GPUs between `since` and `until`, from sacct."""
    now = time.time() if now is None else now
    argv = ["sacct", "-a", "-X", "-D", "-n", "-P", "-S", _stamp(since), "-E", _stamp(until)]
    argv += ["-o", FORMAT]
    try:
        return parse(tools.call(argv).stdout, now)
    except UserError as err:
        if NO_ACCOUNTING not in str(err):
            raise
    print(
        "gpuwarden report: Slurm keeps no accounting here (no slurmdbd): only the jobs "
        "the controller still remembers (MinJobAge) are counted",
        file=sys.stderr,
    )
    return _from_controller(now)


def _from_controller(now: float) -> list[usage.Run]:
    from gpuwarden.slurm.history import seconds

    done = tools.call(["scontrol", "show", "job", "-o"])
    out = []
    for line in done.stdout.splitlines():
        if not line.startswith("JobId="):
            continue
        f = tools.parse_show(line)
        started = epoch(f.get("StartTime", ""))
        nodes = int(f["NumNodes"]) if f.get("NumNodes", "").isdigit() else 1
        gpus = _gpus_in(f.get("TresPerNode", "")) * nodes or _gpus_in(f.get("TRES", ""))
        if started is None or not gpus or started > now:
            continue
        ran = seconds(f.get("RunTime", "")) or 0.0
        user = f.get("UserId", "").partition("(")[0]
        group = f.get("GroupId", "").partition("(")[0]
        submitted = epoch(f.get("SubmitTime", "")) or started
        out.append(
            usage.Run(
                f.get("JobId", "?"),
                user,
                group,
                f.get("Account") or None,
                gpus,
                gpus * ran,
                min(submitted, started),
                started,
                started + ran,
            )
        )
    return out


def report(since: float, until: float, by: str, per: str) -> list[usage.Row]:
    return usage.summarise(usage.keyed(runs(since, until), by), per, since, until)
