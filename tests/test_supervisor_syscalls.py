"""A job's supervisor and the job's own process before its `exec`, held by the system
calls they make per job (strace), which a busy machine does not move.

Each job here is `true`, started by `service.spawn.start` from a process that has
loaded the service, as the service does, with its cgroup where this machine has
device isolation. What is counted is the work between the service's fork and the
job's exec, and the supervisor's end: disk waits (fsync), files opened, readings of
/proc, cgroup directories made or removed, forks. Each line is crossed by the
supervisor before it was made cheap (589f29d: 150 calls a job, 6 fsyncs, 17 files
opened, /proc read 10 times, cgroupfs touched 7 times a hierarchy) and held by what
it does now.
"""

from __future__ import annotations

import collections
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from components import require
from gpuwarden.cgroups import hierarchy
from waiting import wait_for

JOBS = 4
SRC = str(Path(__file__).resolve().parent.parent / "src")
SCRIPT = """
import os, sys
from gpuwarden.service import server, spawn, exitrecord, jobcgroup  # the service's modules, loaded
from gpuwarden.service.identity import person
work, isolate, jobs = sys.argv[1], sys.argv[2] == "1", int(sys.argv[3])
status = os.path.join(work, "jobs")
os.mkdir(status, 0o700)
for n in range(1, jobs + 1):
    launch = spawn.JobStart(
        job=str(n), argv=("true",), owner=person(os.getuid()), cwd=work,
        env={"PATH": "/usr/bin:/bin"}, status_dir=status, output="/dev/null",
        minors=(0,) if isolate else None, present=(0, 1, 2, 3),
    )
    started = spawn.start(launch)
    os.waitpid(started.supervisor, 0)
    assert exitrecord.read_exit_record(status, str(n)).ok
    if isolate:
        jobcgroup.remove_job(jobcgroup.job_dirs(jobcgroup.scope_of(status), str(n)))
if isolate:
    jobcgroup.remove_scope(jobcgroup.scope_of(status))
"""

_CLONE = re.compile(r"^(\d+)\s+(?:<\.\.\. )?(?:clone3?|fork|vfork)\b.*= (\d+)$")
_CALL = re.compile(r"^(\d+)\s+([a-z_0-9]+)\((.*)")


def traced(tmp_path: Path, isolate: bool) -> tuple[list[str], dict[str, str]]:
    """The trace's lines, and each traced process's role: "supervisor", "job" (a
    supervisor's child) or "other"."""
    trace = tmp_path / "trace"
    env = dict(os.environ, PYTHONPATH=SRC)
    subprocess.run(
        ["strace", "-f", "-qq", "-o", str(trace), sys.executable, "-c", SCRIPT,
         str(tmp_path), "1" if isolate else "0", str(JOBS)],
        check=True, env=env, timeout=120,
    )  # fmt: skip
    lines = trace.read_text().splitlines()
    main = lines[0].split()[0]
    parent: dict[str, str] = {}
    for line in lines:
        if match := _CLONE.match(line):  # a call, or the "<... clone resumed>" half of one
            parent[match.group(2)] = match.group(1)
    role = {
        pid: "supervisor" if up == main else "job" if parent.get(up) == main else "other"
        for pid, up in parent.items()
    }
    return lines, role


def counted(tmp_path: Path, isolate: bool) -> dict[str, collections.Counter[str]]:
    """System calls per job of the supervisors ("supervisor") and of the jobs before
    their exec ("job"), by name; "open /proc", "open cgroup" and "cgroupfs" (mkdir,
    rmdir, stat calls under /sys/fs/cgroup) counted apart too."""
    lines, role = traced(tmp_path, isolate)
    counts: dict[str, collections.Counter[str]] = {
        "supervisor": collections.Counter(),
        "job": collections.Counter(),
    }
    execd: set[str] = set()
    for line in lines:
        match = _CALL.match(line)  # the "<... resumed>" half of a call is not counted again
        if match is None or role.get(match.group(1)) not in counts or match.group(1) in execd:
            continue
        pid, name, args = match.groups()
        count = counts[role[pid]]
        count[name] += 1
        if name in ("open", "openat"):
            path = args.split('"')[1] if '"' in args else ""
            if path.startswith("/proc/"):
                count["open /proc"] += 1
            elif path.startswith("/sys/fs/cgroup"):
                count["open cgroup"] += 1
        elif name in ("mkdir", "rmdir", "newfstatat", "stat", "lstat") and "/sys/fs/cgroup" in args:
            count["cgroupfs"] += 1
        if name == "execve" and role[pid] == "job":
            execd.add(pid)
    return counts


def per_job(counts: collections.Counter[str]) -> dict[str, float]:
    return {name: n / JOBS for name, n in counts.items()}


@pytest.fixture
def isolation() -> tuple[bool, int]:
    """Whether this machine gives the jobs cgroups (root, cgroup v1 or v2), and in how
    many hierarchies."""
    require(shutil.which("strace") is not None, "strace is not installed (apt-get install strace)")
    require(os.geteuid() == 0, "a job's supervisor runs as root (the service's)")
    mode, _ = hierarchy.detect()
    if mode == "none":
        return False, 0
    from gpuwarden.service import jobcgroup

    return True, len(jobcgroup.place("/nonexistent/probe").scopes)


def test_the_supervisor_and_the_job_make_few_system_calls(
    tmp_path: Path, isolation: tuple[bool, int]
) -> None:
    isolate, hierarchies = isolation
    counts = counted(tmp_path, isolate)
    sup, job = per_job(counts["supervisor"]), per_job(counts["job"])
    said = f"per job: supervisor {sup}, job before its exec {job}"
    # Disk waits: the exit record's. The room's blocks are taken by its write; the
    # marker's name and data and the job's pid survive a crash of the service, and a
    # crash of the machine ends the job (service.boots).
    assert sup.get("fsync", 0) + sup.get("fdatasync", 0) <= 1, said
    # One fork: the job. No reading of /proc but the supervisor's own start time; the
    # cgroups' place was worked out once in the service, not per job.
    assert sup.get("clone", 0) + sup.get("clone3", 0) + sup.get("fork", 0) == 1, said
    assert sup.get("open /proc", 0) <= 2, said  # its start time, its descriptors
    # One mkdir per hierarchy, nothing else of cgroupfs read or made per job (the
    # scope's directories are made by the first job only).
    assert sup.get("cgroupfs", 0) <= 2 * hierarchies, said
    assert sup.get("openat", 0) + sup.get("open", 0) <= 10, said
    assert sum(counts["supervisor"].values()) / JOBS <= 100, said
    # The job's own steps: a module imported after the fork (a file looked up, opened,
    # read, per job) would cross this line.
    assert job.get("execve") == 1 and job.get("open /proc", 0) <= 1, said
    assert sum(counts["job"].values()) / JOBS <= 50, said


_GO = re.compile(r'"g", 1\)\s+= 1$')  # the go-ahead read, whole or its resumed half
_EXEC = re.compile(r'write\(\d+, "x", 1\b')  # the job's go, once its marker is named


def test_from_the_go_ahead_to_the_jobs_exec_the_supervisor_names_its_marker_only(
    tmp_path: Path, isolation: tuple[bool, int]
) -> None:
    """After the go-ahead the supervisor gives the marker its name (a rename) and lets
    the job exec: no disk wait (the fsync of the marker's directory there, 0.7-1.8 ms
    on the way to every start, went with service.boots), three calls in all."""
    lines, role = traced(tmp_path, isolation[0])
    calls: dict[str, list[str]] = collections.defaultdict(list)  # calls and resumed halves
    for line in lines:
        pid, _, rest = line.partition(" ")
        if role.get(pid) == "supervisor":
            calls[pid].append(rest.strip())
    spans = []
    for made in calls.values():
        go = next(i for i, c in enumerate(made) if _GO.search(c))
        execs = next(i for i, c in enumerate(made) if i > go and _EXEC.match(c))
        spans.append(
            [c.split("(")[0] for c in made[go + 1 : execs + 1] if not c.startswith("<...")]
        )
    assert len(spans) == JOBS, spans
    for span in spans:
        assert not {"fsync", "fdatasync", "sync_file_range"} & set(span), span
        assert "rename" in span and len(span) <= 4, span


_REPORT = re.compile(r'^(\d+)\s+write\((\d+), "\{\\"pid\\": (\d+)')
_REAPED = re.compile(r"^(\d+)\s+(?:<\.\.\. )?wait4\b.*= (\d+)$")


def test_the_supervisor_tells_the_end_before_any_disk_wait_and_its_exit(
    tmp_path: Path, isolation: tuple[bool, int]
) -> None:
    """From the job's end to the end told to the service (the report pipe closed, its
    end-of-file the service's event): the exit record written into its room and
    named, the leases let go, no disk wait; the record's fsync and the supervisor's
    exit (the unmapping of its copy of the service's memory) come after. A supervisor
    that told the end by exiting had the fsync and its exit on the way to the next
    start."""
    lines, role = traced(tmp_path, isolation[0])
    calls: dict[str, list[str]] = collections.defaultdict(list)
    report: dict[str, tuple[str, str]] = {}  # supervisor -> (its report's fd, the job's pid)
    for line in lines:
        if (match := _REPORT.match(line)) and role.get(match.group(1)) == "supervisor":
            report[match.group(1)] = (match.group(2), match.group(3))
        if (match := _CALL.match(line)) and role.get(match.group(1)) == "supervisor":
            calls[match.group(1)].append(line)
        elif (match := _REAPED.match(line)) and role.get(match.group(1)) == "supervisor":
            calls[match.group(1)].append(line)  # the "<... wait4 resumed>" half
    assert len(report) == JOBS, report
    for pid, (fd, job) in report.items():
        mine = calls[pid]
        ended = next(i for i, c in enumerate(mine) if (m := _REAPED.match(c)) and m.group(2) == job)
        told = next((i for i, c in enumerate(mine) if i > ended and f"close({fd})" in c), None)
        assert told is not None, f"supervisor {pid}: the end told only by its exit"
        between = [_CALL.match(c).group(2) for c in mine[ended + 1 : told]]  # type: ignore[union-attr]
        after = [_CALL.match(c).group(2) for c in mine[told + 1 :]]  # type: ignore[union-attr]
        said = f"supervisor {pid}: {between} before the end was told, then {after}"
        assert not {"fsync", "fdatasync", "exit_group"} & set(between), said
        assert len(between) <= 10, said
        assert "fsync" in after and after[-1] == "exit_group", said


SPARES = """
import os, sys, time
from gpuwarden.service import spawn
from gpuwarden.service.forker import Forker
from gpuwarden.service.identity import person
work, jobs = sys.argv[1], int(sys.argv[2])
status = os.path.join(work, "jobs")
os.mkdir(status, 0o700)
forker = Forker(status)  # as the service: its spares stage their files there
forker.warm()
print(forker.proc.pid, flush=True)
sys.stdin.readline()  # traced from here
for n in range(1, jobs + 1):
    launch = spawn.JobStart(
        job=str(n), argv=("true",), owner=person(os.getuid()), cwd=work,
        env={"PATH": "/usr/bin:/bin"}, status_dir=status, output="/dev/null",
    )
    forked = spawn.begin(launch, forker=forker.fork)
    spawn._read_all(forked.report, 30)
    os.close(forked.report)
    os.close(forked.pidfd)
forker.close()
"""


def test_a_spare_takes_its_first_steps_before_its_launch(
    tmp_path: Path, isolation: tuple[bool, int]
) -> None:
    """A spare supervisor (service.forker) takes the steps that need nothing of its job
    (`becoming.become_supervisor`: its session, its descriptors closed, its signals,
    subreaper; the exit record's room and the marker's data, service.staging) while it
    waits: from its launch to its read of the go-ahead it makes the job's calls only
    (its pipes and fork, the room's rename). A spare that took them after its launch
    made 31 calls there (3a08324), these among them."""
    env = dict(os.environ, PYTHONPATH=SRC)
    script = subprocess.Popen(
        [sys.executable, "-c", SPARES, str(tmp_path), str(JOBS)],
        env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert script.stdin is not None and script.stdout is not None
    forker = script.stdout.readline().strip()
    trace = tmp_path / "trace"
    strace = subprocess.Popen(["strace", "-f", "-qq", "-o", str(trace), "-p", forker])
    try:
        wait_for(lambda: _traced(forker), 10, "strace to attach")
        script.stdin.write("go\n")
        script.stdin.flush()
        assert script.wait(120) == 0
    finally:
        strace.terminate()
        strace.wait(30)
    lines: dict[str, list[str]] = collections.defaultdict(list)  # calls and resumed halves
    for line in trace.read_text().splitlines():
        pid, _, rest = line.partition(" ")
        lines[pid].append(rest.strip())
    spans = []
    for made in lines.values():
        go = [i for i, c in enumerate(made) if _GO.search(c)]
        got = [i for i, c in enumerate(made[: go[0] if go else 0]) if c.startswith(_RECEIVED)]
        if got and go:  # from its launch's last part read to its first go-ahead
            between = made[got[-1] + 1 : go[0]]
            spans.append([c.split("(")[0] for c in between if not c.startswith("<...")])
    assert len(spans) >= JOBS - 1, spans  # the first spare may have been asked before
    for span in spans:
        assert not {"setsid", "prctl", "rt_sigaction", "getdents64"} & set(span), span
        # The room and the marker's data made before the launch too (service.staging):
        # the launch renames the room, nothing is opened or read (19 calls before).
        assert not {"openat", "unlink", "getpid", "fsync"} & set(span), span
        assert len(span) <= 10, span
    # The first steps themselves, from its fork to its subreaper (then it stages its
    # job's files, service.staging, and waits for the launch): its
    # descriptors closed by close_range(2), with no listing of /proc/self/fd (whose
    # objects cost a freshly forked process ~0.4 ms, 215336e: 18 calls, these among
    # them), and no more than its session, signals and subreaper need.
    forked = {m.group(1) for c in lines[forker] if (m := _FORKED.search(c))}
    firsts = [first for pid in forked if (first := _first_steps(lines[pid]))]
    assert len(firsts) >= JOBS, (forked, firsts)
    for first in firsts:
        assert "close_range" in first and not {"openat", "getdents64"} & set(first), first
        assert len(first) <= 14, first


_RECEIVED = ("recvmsg(", "<... recvmsg")
_FORKED = re.compile(r"^(?:<\.\.\. )?(?:clone3?|fork|vfork)\b.*= (\d+)$")


def _first_steps(made: list[str]) -> list[str]:
    """A spare's calls from its fork to its subreaper's prctl, its last first step
    (`becoming.become_supervisor`), before its first wait for the launch (its recvmsg);
    none for a process that waits for none."""
    got = [i for i, c in enumerate(made) if c.startswith(_RECEIVED)]
    if not got:
        return []
    last = next((i for i, c in enumerate(made[: got[0]]) if "PR_SET_CHILD_SUBREAPER" in c), got[0])
    return [c.split("(")[0] for c in made[: last + 1] if not c.startswith("<...")]


def _traced(pid: str) -> bool:
    """Whether a tracer is attached to `pid` (/proc/PID/status TracerPid)."""
    with open(f"/proc/{pid}/status") as fh:
        return any(line.split() not in (["TracerPid:", "0"],) for line in fh if "Tracer" in line)
