"""The service's start path, held by counts a busy machine does not move.

Wall-clock figures (bench/service.py) move by a third within an hour on a shared
machine; what the service does per started job does not: how many scheduling
passes, NVML calls and journal commits a job costs, and how many waiting jobs a
start pass plans. These are the service's own counters (`stats`: `plan`,
`machine`, `journal`), read around 1,000 jobs of `true` on the simulated four
A100s, and around starts beside 10,000 held jobs and 10,000 runnable ones.

Each line is a few times what the service does now and far under what a start
path that re-reads the machine per pass, or waits between passes, does: a pass
that read every GPU cost 50 NVML calls and more a started job, a start waiting
on the pacing of passes is a deferred turn of the loop, and a start pass over
every waiting job plans 10,000 jobs a start; one over the first few by priority
(service.ready) plans at most twice its depth, whatever the queue's length.
The loop never waits for a job to set itself up: every start a pass makes is in
flight at once (service.starting), where a loop that waited for each
supervisor's report had one at a time.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

from components import require
from gpuwarden.queueclient import protocol
from gpuwarden.service.ready import DEPTH
from rawservice import Raw, held
from waiting import wait_for

JOBS = 1000
HELD = RUNNABLE = 10_000


def job(work: Path, **extra: Any) -> dict[str, Any]:
    return {
        "argv": ["true"],
        "cwd": str(work),
        "env": {"PATH": "/usr/bin:/bin"},
        "output": "/dev/null",
        "request": {"count": 1},
        **extra,
    }


def counters(raw: Raw) -> dict[str, float]:
    stats = raw.call("stats")
    plan, machine, journal = stats["plan"], stats["machine"], stats["journal"]
    return {
        "started": float(stats["wait_count"]),
        "active": float(sum(sum(users.values()) for users in stats["jobs"].values())),
        "passes": plan["count"],
        "full_passes": plan["full"],
        "start_passes": plan["starts"],
        "start_planned": plan["start_planned"],
        "full_planned": plan.get("full_planned", float("nan")),
        "deferred": plan["deferred"],
        "late": plan["late"],
        "nvml": machine["nvml_calls"] - machine["whole_read_calls"],
        "whole_reads": machine["whole_reads"],
        "config_reads": stats["config"]["reads"],
        "config_checks": stats["config"]["checks"],
        "commits": journal["commits"],
        "fsyncs": journal["fsyncs"],
        "nvml_inits": machine["nvml_inits"],
        "lease_dir_checks": machine["lease_dir_checks"],
        "health_reads": machine["health_reads"],
        "litter_batches": stats["litter"]["batches"],
        "statements": journal["statements"],
    }


def test_a_started_job_costs_a_pass_a_few_nvml_calls_and_a_few_commits(
    raw_service: Raw,
    tmp_path: Path,
) -> None:
    service = raw_service
    # The state directory (drains, XID logs), made with the service, settles first:
    # what changed within 2 s is read again at every use (health.files).
    time.sleep(max(0.0, 2.5 - (time.time() - os.stat(tmp_path / "state").st_mtime)))
    before = counters(service)
    t0 = time.monotonic()
    for _ in range(JOBS // 100):  # pipelined, 100 at a time, as a busy lab submits
        for _ in range(100):
            service.send("submit", **job(tmp_path))
        for _ in range(100):
            service.receive()
    after = wait_for(
        lambda: (c := counters(service))["active"] == 0 and c,
        600,
        lambda: f"every job to end: {counters(service)}",
        every=0.2,
    )
    elapsed = time.monotonic() - t0
    per = {k: (after[k] - before[k]) / JOBS for k in after}
    said = f"per started job: {per} over {elapsed:.1f} s"
    assert after["started"] - before["started"] == JOBS, said
    # No start waits for a pass: each one comes at the next turn of the loop.
    assert after["deferred"] == before["deferred"], said
    # A start pass per event that may start something, not a pass per pass length.
    assert per["passes"] <= 2.5, said
    # NVML: the chosen GPU read again before its lease (7 calls), nothing more per
    # job; the whole machine every 5 s for the enforcement watch (enforce.poll_seconds:
    # unleased use), every 10 s for the efficiency sampler while jobs run, and for
    # the plan at most every minute (service.machine: the tick reads again only the
    # GPUs that showed processes; a whole reading every tick, 1 a second, crosses it).
    assert per["nvml"] <= 10, said
    assert after["whole_reads"] - before["whole_reads"] <= 4 + elapsed / 2.5, said
    # The configuration: looked at by every pass that plans, read by none (its file
    # has not changed since the service read it at start).
    assert after["config_checks"] > before["config_checks"], said
    assert after["config_reads"] == before["config_reads"], said
    # The journal: a commit for a submit, one for a start (its RUNNING rides the next
    # commit: Store.later), one for an end (24f33fd: 4, the RUNNING its own); fsyncs
    # shared by the submits of a turn and by the starts of a pass (each end's is
    # deferred to the next pass's: Store.sync). SQL statements: one row write a state
    # move, no read before a charge (the usage rows kept: service.fairshare), no
    # `synchronous` switched around every commit (24f33fd: 28 a job).
    assert per["commits"] <= 3.5, said
    assert per["fsyncs"] <= 1.5, said
    # NVML initialised around the whole readings only (by the reading, then by the
    # session kept until the next one), not per start: a real driver's nvmlInit opens
    # every device (service.machine). One a start crosses it 100 times over.
    inits = after["nvml_inits"] - before["nvml_inits"]
    assert inits <= 2 * (after["whole_reads"] - before["whole_reads"]) + 4, said
    # The lease directory checked in full once, and again only after a mount or an
    # unmount on the machine (its stat and the mount table say it is the same), not
    # three times a job with a read of /proc/mounts each (3,000 here).
    assert after["lease_dir_checks"] - before["lease_dir_checks"] <= JOBS / 20, said
    # Drains and XID logs: read once and kept while their files stat the same, not
    # listed and read by every pass and again by every start (2,000 here).
    assert after["health_reads"] - before["health_reads"] <= JOBS / 20, said
    # Ended jobs' files removed in batches at the tick (at most one a second), never
    # on the way from a freed GPU to the next start (a batch per pass: about 0.7 a job).
    assert after["litter_batches"] - before["litter_batches"] <= 2 + elapsed, said
    assert per["statements"] <= 18, said


def test_the_service_never_forks_so_it_copies_no_pages_a_job(
    raw_service: Raw, tmp_path: Path
) -> None:
    """The supervisors are forked by the service's forker (service.forker), never by the
    service: a fork of the ~35 MB service made its pages copy-on-write, and its own
    reference counting then copied most of them back, ~1,200 minor page faults and a
    few ms of its CPU per started job. Counted by the kernel (/proc/PID/stat field 10)
    over 200 jobs of `true`: now a few a job (the journal and the heap growing)."""
    service = raw_service
    jobs = 200
    for _ in range(8):  # the first starts load what the later ones find loaded
        service.call("submit", **job(tmp_path))
    wait_for(lambda: counters(service)["active"] == 0, 120, "the first jobs to end")
    before, faults = service.call("stats"), minor_faults(service.pid)
    for _ in range(jobs):
        service.send("submit", **job(tmp_path))
    for _ in range(jobs):
        service.receive()
    wait_for(lambda: counters(service)["active"] == 0, 600, "every job to end", every=0.2)
    after = service.call("stats")
    per = (minor_faults(service.pid) - faults) / jobs
    said = f"{per:.1f} minor faults per started job; forker {before['forker']} -> {after['forker']}"
    assert after["wait_count"] - before["wait_count"] == jobs, said
    # Every supervisor forked by the one forker, started once.
    assert after["forker"]["forks"] - before["forker"]["forks"] == jobs, said
    assert after["forker"]["started"] == 1 and after["forker"]["pid"] > 0, said
    assert per <= 100, said
    # A supervisor whose job ended takes the next one: few forks, and few exits, a job
    # (215336e: a fork a job, each supervisor's exit the unmapping of its ~14 MB).
    forked = (after["forker"]["forked"] - before["forker"]["forked"]) / jobs
    assert forked <= 0.1, said


def minor_faults(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as fh:
        return int(fh.read().rsplit(")", 1)[1].split()[7])


def test_submits_answered_in_one_turn_share_one_fsync(raw_service: Raw, tmp_path: Path) -> None:
    """A job id is told only once it is on disk, but the submits a turn of the loop
    answers (clients at once, or one client's pipelined requests) wait for one fsync
    between them, not one each: 100 sent at once are 100 commits and a few fsyncs."""
    service = raw_service
    before = counters(service)
    service.sock.sendall(
        b"".join(
            protocol.encode({"v": protocol.VERSION, "op": "submit", **held(tmp_path)})
            for _ in range(100)
        )
    )
    jobs = [service.receive()["job"] for _ in range(100)]
    after = counters(service)
    assert len(set(jobs)) == 100
    assert after["commits"] - before["commits"] == 100, (before, after)
    assert 1 <= after["fsyncs"] - before["fsyncs"] <= 10, (before, after)


def test_the_starts_of_one_pass_set_themselves_up_at_once(raw_service: Raw, tmp_path: Path) -> None:
    """Four free GPUs and an array of four one-GPU jobs: one start pass starts all four,
    giving each supervisor its go-ahead without waiting for the one before to report
    the job's pid (about 15 ms of a start's 25): four starts in flight at once, each
    report an event of the loop. A loop that waited for each report had one."""
    service = raw_service
    wait_for(lambda: counters(service)["passes"] > 0, 60, "the first pass")
    before = service.call("stats")["starting"]
    assert before["most_in_flight"] == 0, before
    service.call("submit", **job(tmp_path), array="1-4")
    wait_for(
        lambda: (c := counters(service))["started"] == 4 and c["active"] == 0,
        60,
        lambda: f"the four jobs to run and end: {counters(service)}",
        every=0.1,
    )
    after = service.call("stats")["starting"]
    assert after["begun"] == 4, after
    assert after["most_in_flight"] == 4, f"starts one at a time: {after}"
    assert (after["in_flight"], after["overdue"]) == (0, 0), after
    states = {j["state"] for j in service.call("jobs")["jobs"]}
    assert states == {"COMPLETED"}, states


def test_the_starts_of_one_pass_share_one_fsync(raw_service: Raw, tmp_path: Path) -> None:
    """A start is durable before its supervisor's go-ahead, but the starts of one pass
    share one fsync: an array of four on four free GPUs costs its submit's fsync and one
    for the four starts (the RUNNING each report brings needs none: the supervisor's
    marker has the pid for a restart). A pass that fsynced each start made five."""
    service = raw_service
    wait_for(lambda: counters(service)["passes"] > 0, 60, "the first pass")
    before = counters(service)
    array = service.call("submit", **job(tmp_path, argv=["sleep", "60"]), array="1-4")["job"]
    running = wait_for(
        lambda: (c := counters(service))["started"] - before["started"] == 4 and c,
        60,
        lambda: f"the four jobs to run: {counters(service)}",
        every=0.1,
    )
    try:
        assert service.call("stats")["starting"]["most_in_flight"] == 4
        assert running["fsyncs"] - before["fsyncs"] <= 3, (before, running)
    finally:
        service.call("cancel", jobs=[array])
    wait_for(lambda: counters(service)["active"] == 0, 60, "the four jobs to end")


def test_a_start_beside_10000_held_jobs_plans_only_what_may_start(
    raw_service: Raw,
    tmp_path: Path,
) -> None:
    service = raw_service
    reply = service.call("submit", **held(tmp_path), array=f"1-{HELD}")
    assert reply["tasks"] == HELD
    wait_for(lambda: counters(service)["passes"] > 0, 60, "the first pass")
    before = counters(service)
    for _ in range(20):
        ran = service.call("submit", **job(tmp_path))["job"]
        wait_for(
            lambda j=ran: service.call("queue", ids=[j])["total"] == 0,
            60,
            f"job {ran} to run and end",
            every=0.02,
        )
    # The full pass that refreshes what `queue` shows after the starts: it plans the
    # jobs that may start (none wait now), not the held ones.
    after = wait_for(
        lambda: (c := counters(service))["full_passes"] > before["full_passes"] and c,
        30,
        "a full pass after the starts",
    )
    passes = after["start_passes"] - before["start_passes"]
    planned = after["start_planned"] - before["start_planned"]
    assert after["started"] - before["started"] == 20
    assert after["deferred"] == before["deferred"]
    assert passes >= 20, after
    assert planned <= 2 * passes, f"{planned} jobs planned in {passes} start passes"
    full = after["full_passes"] - before["full_passes"]
    surveyed = after["full_planned"] - before["full_planned"]
    assert surveyed <= 2 * full, f"{surveyed} jobs planned in {full} full passes"
    rows = service.call("queue", limit=5)
    assert rows["total"] == HELD and {r["reason"] for r in rows["jobs"]} == {"Held"}


def starts(service: Raw, work: Path, count: int) -> dict[str, float]:
    """Counters around `count` one-GPU jobs submitted one at a time, each run and ended."""
    before = counters(service)
    for _ in range(count):
        ran = service.call("submit", **job(work))["job"]
        wait_for(
            lambda j=ran: service.call("queue", ids=[j])["total"] == 0,
            60,
            f"job {ran} to run and end",
            every=0.02,
        )
    after = counters(service)
    assert after["started"] - before["started"] == count
    assert after["deferred"] == before["deferred"]
    return {k: after[k] - before[k] for k in after}


def test_a_start_beside_10000_runnable_jobs_plans_as_few_as_beside_none(
    raw_service: Raw,
    tmp_path: Path,
) -> None:
    """10,000 four-GPU jobs wait (one GPU is busy), not held: every start pass could
    plan them all. The one-GPU jobs submitted beside them start by backfill, each
    after a start pass that plans at most twice `DEPTH` jobs, as beside none."""
    service = raw_service
    empty = starts(service, tmp_path, 10)
    holder = service.call("submit", **job(tmp_path, argv=["sleep", "600"]))["job"]
    wait_for(
        lambda: service.call("queue", ids=[holder])["jobs"][0]["state"] == "RUNNING",
        60,
        "the job holding one GPU to run",
    )
    wide = job(tmp_path, request={"count": 4})
    array = service.call("submit", **wide, array=f"1-{RUNNABLE}")["job"]
    try:
        full = counters(service)["full_passes"]
        wait_for(lambda: counters(service)["full_passes"] > full, 60, "a full pass ranking them")
        deep = starts(service, tmp_path, 20)
        for counted in (empty, deep):
            assert counted["start_passes"] >= counted["started"], counted
            per_pass = counted["start_planned"] / counted["start_passes"]
            assert per_pass <= 2 * DEPTH + 1, f"{per_pass:.0f} jobs planned a start pass"
        rows = service.call("queue", limit=3)
        assert rows["total"] == RUNNABLE + 1
    finally:
        service.call("cancel", jobs=[array])
        service.call("cancel", jobs=[holder])


def test_a_freed_gpu_and_a_submit_start_the_next_job_in_the_turn_that_took_them(
    raw_service: Raw, tmp_path: Path
) -> None:
    """A job holding every GPU ends while another waits; later a job is submitted on an
    idle machine. Each starts in the turn of the loop that took the event (the end's,
    the submit's): no pass left for a later turn (`late`), none slept on (`deferred`),
    one start pass each, and one fsync each between the event and the go-ahead (the
    end's commit and the submit's ride on the start's). A loop that planned at its
    next turn counted a late pass per start; one that synced the end, or answered the
    submit, before the start's fsync counted two."""
    service = raw_service
    wait_for(lambda: counters(service)["passes"] > 0, 60, "the first pass")
    fifo = tmp_path / "hold.fifo"
    os.mkfifo(fifo)
    wide = job(tmp_path, argv=["sh", "-c", f"read x < {fifo}"], request={"count": 4})
    holder = service.call("submit", **wide)["job"]
    wait_for(
        lambda: service.call("queue", ids=[holder])["jobs"][0]["state"] == "RUNNING",
        60,
        "the job holding every GPU to run",
    )
    waiter = service.call("submit", **job(tmp_path, argv=["sleep", "600"]))["job"]
    wait_for(lambda: counters(service)["full_passes"] > 1, 30, "a full pass seeing it wait")
    before = counters(service)
    with open(fifo, "w") as fh:  # the holder reads a line and ends
        fh.write("go\n")
    after = wait_for(
        lambda: (c := counters(service))["started"] > before["started"] and c,
        60,
        "the waiting job to start",
        every=0.05,
    )
    ended = {k: after[k] - before[k] for k in after}
    service.call("cancel", jobs=[waiter])
    wait_for(lambda: counters(service)["active"] == 0, 60, "the waiter to end")
    before = counters(service)
    submitted_job = service.call("submit", **job(tmp_path, argv=["sleep", "600"]))["job"]
    after = wait_for(
        lambda: (c := counters(service))["started"] > before["started"] and c,
        60,
        "the submitted job to start",
        every=0.05,
    )
    submitted = {k: after[k] - before[k] for k in after}
    service.call("cancel", jobs=[submitted_job])
    wait_for(lambda: counters(service)["active"] == 0, 60, "the submitted job to end")
    for counted in (ended, submitted):
        assert counted["late"] == 0 and counted["deferred"] == 0, counted
        assert counted["start_passes"] == 1 and counted["fsyncs"] == 1, counted


def test_between_an_end_and_the_next_go_ahead_only_what_the_start_needs(
    raw_service: Raw, tmp_path: Path
) -> None:
    """A job holding every GPU ends while another waits: the service's system calls
    from the turn's wake-up to the waiting job's go-ahead (strace on the loop's thread)
    are the end's record and the start. The ended job's notices (none here: no webhook
    or mail is configured, so none goes to the notifier's helper at all) and its empty
    cgroup's removal come after the go-ahead. The tree before (215336e) made ~130 calls
    there, among them a `write` of the notice to the helper and the cgroup's `rmdir`s."""
    require(shutil.which("strace") is not None, "strace is not installed (apt-get install strace)")
    service = raw_service
    # What changed within 2 s is read again at every use (health.files): settled first.
    time.sleep(max(0.0, 2.5 - (time.time() - os.stat(tmp_path / "state").st_mtime)))
    wait_for(lambda: counters(service)["passes"] > 0, 60, "the first pass")
    fifo = tmp_path / "hold.fifo"
    os.mkfifo(fifo)
    wide = job(tmp_path, argv=["sh", "-c", f"read x < {fifo}"], request={"count": 4})
    holder = service.call("submit", **wide)["job"]
    wait_for(
        lambda: service.call("queue", ids=[holder])["jobs"][0]["state"] == "RUNNING",
        60,
        "the job holding every GPU to run",
    )
    waiter = service.call("submit", **job(tmp_path, argv=["sleep", "600"]))["job"]
    wait_for(lambda: counters(service)["full_passes"] > 1, 30, "a full pass seeing it wait")
    trace = tmp_path / "loop.trace"
    strace = subprocess.Popen(
        ["strace", "-qq", "-s", "64", "-o", str(trace), "-p", str(service.pid)],
        stderr=subprocess.DEVNULL,
    )
    try:
        time.sleep(0.5)  # attached
        service.call("stats")  # a turn of the loop seen in the trace: strace is on
        wait_for(lambda: trace.exists() and "epoll_wait" in trace.read_text(), 30, "strace")
        before = counters(service)
        time.sleep(0.3)  # that turn over
        with open(fifo, "w") as fh:  # the holder reads a line and ends
            fh.write("go\n")
        wait_for(
            lambda: counters(service)["started"] > before["started"],
            60,
            "the waiting job to start",
            every=0.05,
        )
        time.sleep(0.5)  # the turn's last calls, after the go-ahead
    finally:
        strace.send_signal(signal.SIGINT)
        strace.wait(30)
        service.call("cancel", jobs=[waiter])
    wait_for(lambda: counters(service)["active"] == 0, 60, "the waiter to end")
    lines = [line for line in trace.read_text().splitlines() if "(" in line]
    go = next(i for i, line in enumerate(lines) if re.match(r'write\(\d+, "g", 1\)', line))
    woke = max(i for i in range(go) if lines[i].startswith("epoll_wait("))
    between, after = lines[woke + 1 : go], lines[go + 1 :]
    said = f"{len(between)} calls:\n" + "\n".join(between)
    assert not [c for c in between if c.startswith("rmdir(")], said
    assert not [c for c in (*between, *after) if "job_ended" in c], said
    if any(f"/job-{holder}/" in c for c in between):  # it had a cgroup: removed after
        assert [c for c in after if c.startswith("rmdir(") and f"/job-{holder}" in c], after
    # The lease directory judged once in the turn (leases.dir.Checked.turn), its path
    # looked at by that judgement and by the pass's listing: 215336e judged it at the
    # end's release, the pass's listing and the start's lease, 4 lstats of it.
    leases = str(tmp_path / "leases")
    assert sum(c.startswith(f'newfstatat(AT_FDCWD, "{leases}", ') for c in between) <= 2, said
    # Where the ended job's cgroup is: kept from its start (215336e read /proc/self/cgroup).
    assert not [c for c in between if "/proc/self/cgroup" in c], said
    # No file made: the lease record's was made after an earlier turn's go-ahead
    # (leases.spares); 215336e created it here (0.1-1.5 ms on a busy disk).
    assert not [c for c in between if "O_EXCL" in c], said
    # The ended job's cgroup found empty without a 4 MiB buffer mapped for the read.
    assert not [c for c in between if c.startswith(("mmap(", "munmap("))], said
    # One fsync of the journal's log, kept open (215336e opened and closed it for each).
    assert sum(c.startswith("fdatasync(") for c in between) == 1, said
    assert not [c for c in between if c.startswith("openat(") and "-wal" in c], said
