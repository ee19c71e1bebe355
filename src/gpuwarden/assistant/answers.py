"""What each of `gpuwarden mcp`'s tools answers, as plain data (no `mcp` here).

Everything is asked as the user who runs the server: the queue service names them
from the kernel (SO_PEERCRED) and hides what it hides from them; `where_would_it_run`
and `submit` run the user's own `gpuwarden run --dry-run` and `gpuwarden submit`, so
an assistant gets the answers and the refusals the user would. No tool acts on
anyone else's job, and none is an admin's.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Optional

from gpuwarden.assistant.previews import Previews
from gpuwarden.base.errors import UserError
from gpuwarden.base.records import record
from gpuwarden.base.units import format_size
from gpuwarden.lab.reading import Lab, read_lab
from gpuwarden.lab.waiting import explain, waiting_order

#: Rows of `queue` an answer carries at most (a model's context is not a log file).
MAX_ROWS = 200
MAX_LOG_LINES = 500
MAX_TEXT = 200  # characters of an option's value
SECONDS = 60  # a `gpuwarden` the server runs for an answer


@record
class Wish:
    """What a job asks for, as `run`/`submit` options (see `options`)."""

    gpus: Optional[int] = None
    gpu_ids: Optional[str] = None
    min_free: Optional[str] = None
    max_util: Optional[float] = None
    model: Optional[str] = None
    mig: Optional[str] = None
    mem: Optional[str] = None
    exclude: Optional[str] = None
    time: Optional[str] = None

    def options(self) -> list[str]:
        """The command-line options, each `--name=value` (a value is never an option)."""
        out = []
        for flag, value in (
            ("--count", self.gpus),
            ("--gpus", self.gpu_ids),
            ("--min-free", self.min_free),
            ("--max-util", self.max_util),
            ("--model", self.model),
            ("--mig", self.mig),
            ("--mem", self.mem),
            ("--exclude", self.exclude),
            ("--time", self.time),
        ):
            if value is None:
                continue
            out.append(f"{flag}={checked(str(value), flag)}")
        return out


def checked(value: str, what: str) -> str:
    if len(value) > MAX_TEXT or not value.isprintable() or not value.strip():
        raise UserError(f"{what}: expected a short printable value, got {value[:40]!r}")
    return value


def gpu_line(g: dict[str, Any]) -> dict[str, Any]:
    """One GPU of the web model, in the words a person would use."""

    def size(n: Any) -> Optional[str]:
        return format_size(n) if isinstance(n, int) else None

    out = {
        "index": g.get("index"),
        "name": g.get("name"),
        "utilization_percent": g.get("utilization"),
        "memory_used": size(g.get("memory_used")),
        "memory_total": size(g.get("memory_total")),
        "temperature_c": g.get("temperature"),
        "power_w": g.get("power_draw"),
        "health": (g.get("health") or {}).get("level"),
        "drained": (g.get("drain") or {}).get("reason"),
        "leases": [
            {"user": x.get("user"), "job": x.get("job"), "age_s": x.get("age")}
            for x in g.get("leases") or ()
        ],
        "processes": [
            {
                "user": p.get("user"),
                "pid": p.get("pid"),
                "program": p.get("name"),
                "memory": size(p.get("memory")),
                "under_a_lease": p.get("reserved"),
            }
            for p in g.get("processes") or ()
        ],
        "free": not g.get("leases") and not g.get("processes") and not g.get("drain"),
    }
    if g.get("lost") or g.get("error"):
        out["error"] = g.get("error") or "lost"
    if g.get("slices"):
        out["mig_slices"] = [
            {
                "index": m.get("index"),
                "profile": m.get("profile"),
                "memory_used": size(m.get("memory_used")),
                "memory_total": size(m.get("memory_total")),
                "leases": [{"user": x.get("user"), "job": x.get("job")} for x in m["leases"]],
            }
            for m in g["slices"]
        ]
    return out


def job_line(job: Mapping[str, Any], now: float) -> dict[str, Any]:
    """One queue row, trimmed to what answers a question about it."""
    start = job.get("estimated_start")
    out = {
        "job": str(job.get("label") or job.get("id")),
        "user": job.get("user"),
        "state": job.get("state"),
        "gpus": job.get("indices") or job.get("count"),
        "reason": job.get("reason"),
        "priority": job.get("priority"),
        "waited_s": round(((job.get("started") or now) - (job.get("submitted") or now)), 1),
        "command": " ".join(job["command"]) if isinstance(job.get("command"), list) else None,
    }
    if job.get("state") == "PENDING":
        out["estimated_start"] = (
            time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(start))
            if isinstance(start, (int, float))
            else None
        )
    if job.get("elapsed") is not None:
        out["elapsed_s"] = round(float(job["elapsed"]), 1)
    if job.get("time_limit"):
        out["time_limit_s"] = job["time_limit"]
    return out


class Answers:
    """The tools' answers for one user. `socket`: the queue service's; `gpuwarden`:
    how to run the user's own command line."""

    def __init__(
        self,
        socket: str,
        gpuwarden: Sequence[str] = (sys.executable, "-m", "gpuwarden"),
        reader: Callable[..., Lab] = read_lab,
    ) -> None:
        self.socket = socket
        self.gpuwarden = list(gpuwarden)
        self.reader = reader
        self.previews = Previews()

    # -- reading ------------------------------------------------------------------

    def lab(self) -> Lab:
        return self.reader(self.socket)

    def gpus(self) -> dict[str, Any]:
        lab = self.lab()
        return {
            "host": lab.host,
            "gpus": [gpu_line(g) for g in lab.gpus],
            "error": lab.error,
        }

    def queue(self, user: Optional[str] = None, limit: int = 50) -> dict[str, Any]:
        lab = self.lab()
        self._need_service(lab)
        jobs = [j for j in lab.jobs if user is None or j.get("user") == user]
        running = [j for j in jobs if j.get("state") in ("RUNNING", "STARTING")]
        waiting = waiting_order(jobs)
        limit = max(1, min(limit, MAX_ROWS))
        return {
            "host": lab.host,
            "you": lab.user,
            "running": [job_line(j, lab.taken_at) for j in running[:limit]],
            "waiting": [job_line(j, lab.taken_at) for j in waiting[:limit]],
            "running_total": len(running),
            "waiting_total": len(waiting),
        }

    def why(self, job: str) -> dict[str, Any]:
        lab = self.lab()
        self._need_service(lab)
        wanted = job.strip()
        for row in lab.jobs:
            if wanted in (str(row.get("id")), str(row.get("label"))):
                return explain(row, lab.jobs, lab.taken_at)
        raise UserError(
            f"job {wanted} is not queued or running (ended jobs: `gpuwarden jobs`); "
            "an array's task is named as 12_7"
        )

    def my_jobs(self, lines: int = 10) -> dict[str, Any]:
        from gpuwarden.queueclient.client import require

        lab = self.lab()
        self._need_service(lab)
        mine = [j for j in lab.jobs if j.get("user") == lab.user]
        with require(self.socket) as client:
            ended, _ = client.listing("jobs", 10, user=lab.user)
        out = []
        for row in [*mine, *ended]:
            line = job_line(row, lab.taken_at)
            if row.get("state") == "PENDING":
                line["why"] = explain(row, lab.jobs, lab.taken_at)["summary"]
            elif lines > 0:
                line["log_tail"] = self._tail(int(row["id"]), lines, quiet=True)
            if row.get("exit_code") is not None:
                line["exit_code"] = row["exit_code"]
            if row.get("error"):
                line["error"] = row["error"]
            out.append(line)
        return {"you": lab.user, "jobs": out}

    def log(self, job: int, lines: int = 50) -> dict[str, Any]:
        return {"job": job, "lines": self._tail(job, max(1, min(lines, MAX_LOG_LINES)))}

    def _tail(self, job: int, lines: int, quiet: bool = False) -> list[str]:
        from gpuwarden.jobs.output import tail
        from gpuwarden.queueclient.client import require

        try:
            with require(self.socket) as client:
                reply = client.call("logs", job=job)
            if reply.get("attached"):
                return ["(it ran attached to a terminal: its output went there)"]
            return tail(str(reply["output"]), int(reply["uid"]), lines)
        except UserError as err:
            if quiet:
                return [f"({err})"]
            raise

    def usage(self, days: float = 30.0, by: str = "user") -> dict[str, Any]:
        """GPU-hours, jobs and waits over the last `days` grouped `by` user, group or
        account, as `gpuwarden report` (what the service shows you of them); your
        decayed usage and fair-share factor (`share`); your last jobs' GPU-hours."""
        from gpuwarden.queueclient.client import require
        from gpuwarden.usage.report import BY

        if by not in BY:
            raise UserError(f"by: one of {', '.join(BY)}, got {by!r}")
        if not 0 < days <= 3660:
            raise UserError(f"days: 0 to 3660, got {days:g}")
        now = time.time()
        with require(self.socket) as client:
            me = client.call("hello")["user"]
            share = client.call("share")
            ended, _ = client.listing("jobs", 50, user=me)
            ask = {"since": now - days * 86400, "until": now, "by": by, "per": "all"}
            report = client.call("report", waste=False, **ask).get("rows") or []
        users = [u for u in share.get("users") or () if isinstance(u, dict)]
        mine = next((u for u in users if u.get("user") == me), None)
        hours = sum(
            len(j.get("gpus") or ()) * float(j.get("elapsed") or 0.0) / 3600.0 for j in ended
        )
        return {
            "you": me,
            "report": {"days": days, "by": by, "rows": report},
            "fair_share": None
            if mine is None
            else {
                "decayed_gpu_hours": round(float(mine.get("usage") or 0.0) / 3600.0, 3),
                "share": mine.get("share"),
                "factor": mine.get("factor"),
            },
            "users": len(users),
            "last_jobs": len(ended),
            "last_jobs_gpu_hours": round(hours, 3),
        }

    # -- what would happen -------------------------------------------------------

    def would_run(self, wish: Wish) -> dict[str, Any]:
        """`gpuwarden run --dry-run` with these options: which GPUs now, or why none."""
        done = self._cli(["run", "--dry-run", *wish.options()])
        return {
            "answer": done.stdout.strip(),
            "fits_now": done.returncode == 0,
            "never_fits": done.returncode == 2,
            "error": done.stderr.strip() or None,
        }

    def submit(
        self,
        command: Sequence[str],
        wish: Wish,
        cwd: Optional[str],
        after: Sequence[int] = (),
        token: Optional[str] = None,
    ) -> dict[str, Any]:
        """Without `token`: the preview and its token, nothing sent. With the preview's
        token: the same request, sent as `gpuwarden submit`."""
        if not command or not all(isinstance(w, str) and w for w in command):
            raise UserError('command: a list of words, e.g. ["python", "train.py"]')
        folder = os.path.abspath(cwd or os.getcwd())
        if not os.path.isdir(folder):
            raise UserError(f"cwd {folder}: not a directory")
        options = wish.options() + [f"--after={int(a)}" for a in after]
        argv = ["submit", *options, "--", *command]
        request = {"argv": argv, "cwd": folder}
        if token is None:
            shown = self._cli(["submit", "--dry-run", *options, "--", *command], folder)
            if shown.returncode != 0:
                raise UserError(shown.stderr.strip() or "gpuwarden submit refused the request")
            where = self.would_run(wish)
            return {
                "submitted": False,
                "preview": {
                    "command_line": "gpuwarden " + " ".join(argv),
                    "folder": folder,
                    "request": shown.stdout.strip(),
                    "where_it_would_run_now": where["answer"] or where["error"],
                },
                "token": self.previews.token(request),
                "next": "show this preview to the user; to queue it, call submit again with "
                "the same arguments and this token",
            }
        self.previews.redeem(request, token)
        done = self._cli(argv, folder)
        if done.returncode != 0:
            raise UserError(done.stderr.strip() or "gpuwarden submit failed")
        job = done.stdout.strip().splitlines()[-1] if done.stdout.strip() else None
        return {"submitted": True, "job": job, "said": done.stderr.strip()}

    # -- helpers -----------------------------------------------------------------

    def _cli(self, argv: list[str], cwd: Optional[str] = None) -> subprocess.CompletedProcess[str]:
        env = dict(os.environ)
        if self.socket:
            env["GPUWARDEN_SOCKET"] = self.socket
        try:
            return subprocess.run(
                [*self.gpuwarden, *argv],
                capture_output=True,
                text=True,
                timeout=SECONDS,
                cwd=cwd,
                env=env,
                stdin=subprocess.DEVNULL,
            )
        except subprocess.TimeoutExpired:
            raise UserError(f"gpuwarden {argv[0]} gave no answer within {SECONDS}s") from None

    @staticmethod
    def _need_service(lab: Lab) -> None:
        if lab.service is not None:
            raise UserError(f"{lab.service}: there is no queue here (the GPUs tool still works)")
