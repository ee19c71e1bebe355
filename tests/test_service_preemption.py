"""Preemptible jobs and retries through the real service, as real users (Slurm's
scavenger QOS with PreemptMode=REQUEUE and GraceTime, `scontrol requeue`, gflow's
`--max-retries`).

Eight simulated A100s; alice fills them with preemptible jobs that note, in a file of
their own, each start (with GPUWARDEN_RESTART_COUNT) and each SIGTERM, with the time;
bob's normal job takes two of them back.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from servicetools import USER_PY, Server, cli_as, serving, submit
from users import make_user
from waiting import wait_for

EIGHT = str(Path(__file__).resolve().parent / "data" / "idle-8xa100.toml")
GRACE = 4.0

#: A preemptible job: notes its start and each SIGTERM in NOTES/<its id>; on SIGTERM it
#: saves (here: notes) and exits, or with `stubborn` keeps running until killed.
JOB = (
    "import os, signal, sys, time\n"
    "path = os.path.join(sys.argv[1], os.environ['GPUWARDEN_JOB'])\n"
    "def note(word):\n"
    "    with open(path, 'a') as f: f.write(f'{word} {time.time()}\\n')\n"
    "def term(*_):\n"
    "    note('term')\n"
    "    if sys.argv[2] != 'stubborn': sys.exit(0)\n"
    "signal.signal(signal.SIGTERM, term)\n"
    "note('start ' + os.environ['GPUWARDEN_RESTART_COUNT'])\n"
    "while True: time.sleep(0.05)\n"
)


@pytest.fixture
def server(tmp_path: Path, open_dir: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Server]:
    monkeypatch.setenv("GPUWARDEN_SERVICE_PREEMPT_GRACE", str(GRACE))
    monkeypatch.setenv("GPUWARDEN_SERVICE_RETRY_BACKOFF", "0.5")
    monkeypatch.setenv("GPUWARDEN_SERVICE_PREEMPT_CHARGE", "0")  # scavenging is free here
    # Two GPUs a user: alice's eight preemptible jobs run beyond it.
    yield from serving(tmp_path, open_dir, monkeypatch, "--max-gpus-per-user", "2", spec=EIGHT)


def notes(folder: Path, job: int) -> list[tuple[str, float]]:
    path = folder / str(job)
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        *words, at = line.split()
        out.append((" ".join(words), float(at)))
    return out


@pytest.mark.slow
def test_a_normal_job_takes_gpus_back_from_preemptible_ones_within_the_grace(
    server: Server, cli: Any
) -> None:
    alice, bob = make_user("alice", ("lab",)), make_user("bob")
    folder = server.work / "notes"
    folder.mkdir(mode=0o777)
    folder.chmod(0o777)

    def preemptible(how: str, **kw: object) -> dict[str, object]:
        return {"request": {"count": 1}, "preemptible": True, **kw}

    argv = [USER_PY, "-c", JOB, str(folder)]
    first = server.call(
        alice,
        "submit",
        argv=[*argv, "polite"],
        cwd=str(server.work),
        env={"PATH": "/usr/bin:/bin"},
        array="0-6",
        **preemptible("polite"),
    )
    polite = first["ids"]
    for job in polite:
        server.wait_state(job, ("RUNNING",))
    stubborn = submit(server, alice, [*argv, "stubborn"], **preemptible("stubborn"))
    server.wait_state(stubborn, ("RUNNING",))
    wait_for(lambda: all(notes(folder, j) for j in (*polite, stubborn)), 30, "every job started")
    assert all(server.job(j)["preemptible"] for j in (*polite, stubborn))

    asked = time.time()
    normal = submit(server, bob, ["sleep", "3"], request={"count": 2})
    # The youngest go: the stubborn one, and one polite one.
    victims: list[int] = wait_for(
        lambda: (
            [j for j in (*polite, stubborn) if any(w == "term" for w, _ in notes(folder, j))]
            if sum(any(w == "term" for w, _ in notes(folder, j)) for j in (*polite, stubborn)) >= 2
            else None
        ),
        30,
        lambda: f"two SIGTERMs\n{server.log_tail()}",
    )
    assert len(victims) == 2 and stubborn in victims, victims
    for job in victims:
        term = next(at for w, at in notes(folder, job) if w == "term")
        assert term - asked < 1.0, (job, term - asked)
    row = server.wait_state(normal, ("RUNNING", "COMPLETED"), timeout=GRACE + 10)
    assert row["started"] - asked < GRACE + 2.0, row["started"] - asked
    # The stubborn one was killed at the grace, not before.
    assert row["started"] - asked >= GRACE - 0.5
    for job in victims:
        again = server.job(job)
        assert again["restarts"] == 1 and again["preemptions"] == 1, again
    logs = cli_as(server, alice, "logs", str(stubborn))
    assert f"gpuwarden: job {stubborn} preempted at" in logs.stdout + logs.stderr
    # Once bob's job is done, the victims run again, told it is their second run.
    server.wait_state(normal, ("COMPLETED",), timeout=30)
    for job in victims:
        wait_for(
            lambda job=job: ("start 1" in [w for w, _ in notes(folder, job)]) or None,
            30,
            lambda job=job: f"job {job} started again: {notes(folder, job)}",
        )
    others = [j for j in polite if j not in victims]
    assert all(server.job(j)["restarts"] == 0 for j in others)
    queue = cli_as(server, alice, "queue")
    assert queue.returncode == 0, queue.stderr
    lines = {ln.split()[0]: ln for ln in queue.stdout.splitlines()[1:] if ln.strip()}
    assert any("preemptible (run 2, preempted 1x)" in lines[label] for label in lines), queue.stdout
    stats = server.call(None, "stats")
    assert stats["preemptions"] == [{"user": "gw-alice", "count": 2}], stats
    exported = cli(
        "exporter", "--once", env={"GPUWARDEN_SOCKET": server.socket, "GPUWARDEN_SIM": EIGHT}
    )
    assert "gpuwarden_queue_preemptions_total{hostname=" in exported.stdout, exported.stderr
    assert 'user="gw-alice"} 2.0' in exported.stdout
    # Charged at service.preempt_charge (0 here): alice's runs cost her nothing, bob's did.
    usage = {u["user"]: u["usage"] for u in server.call(None, "share")["users"]}
    assert usage.get("gw-alice", 0.0) == 0.0 and usage["gw-bob"] > 0, usage


def test_a_preemptible_sweep_beyond_the_limit_and_what_is_refused(server: Server) -> None:
    alice = make_user("alice", ("lab",))
    sub = cli_as(
        server,
        alice,
        "submit",
        "--preemptible",
        "--preempt",
        "cancel",
        "-g",
        "1",
        "--param",
        "lr=1,2,3",
        "--",
        "sleep",
        "60",
    )
    assert sub.returncode == 0, sub.stderr
    array = int(sub.stdout.strip())
    rows = [r for r in server.call(alice, "queue")["jobs"] if r.get("array_job") == array]
    assert len(rows) == 3 and all(r["preemptible"] for r in rows), rows
    for row in rows:  # three GPUs, over her limit of two
        server.wait_state(row["id"], ("RUNNING",))
    bad = cli_as(server, alice, "submit", "--preempt", "cancel", "--", "true")
    assert bad.returncode != 0 and "add --preemptible" in bad.stderr
    # carol (an admin: no GPU limit) needs six GPUs: one task goes, and ends PREEMPTED.
    carol = make_user("carol")
    normal = submit(server, carol, ["sleep", "1"], request={"count": 6})
    server.wait_state(normal, ("RUNNING", "COMPLETED"), timeout=GRACE + 30)
    ended = [r for r in server.call(alice, "jobs")["jobs"] if r.get("array_job") == array]
    assert [r["state"] for r in ended] == ["PREEMPTED"], ended
    history = cli_as(server, alice, "jobs")
    assert "PREEMPTED" in history.stdout, history.stdout
    server.call(alice, "cancel", jobs=[array])


def test_max_retries_reruns_a_failing_job_then_marks_it_failed(server: Server) -> None:
    alice = make_user("alice", ("lab",))
    sub = cli_as(
        server,
        alice,
        "submit",
        "--max-retries",
        "2",
        "--",
        "sh",
        "-c",
        'echo "run $GPUWARDEN_RESTART_COUNT"; exit 3',
    )
    assert sub.returncode == 0, sub.stderr
    job = int(sub.stdout.strip())
    row = server.wait_state(job, ("FAILED",), timeout=60)
    assert row["exit_code"] == 3 and row["restarts"] == 2, row
    logs = cli_as(server, alice, "logs", str(job)).stdout
    assert [ln for ln in logs.splitlines() if ln.startswith("run")] == [
        "run 0",
        "run 1",
        "run 2",
    ], logs
    # A job that succeeds is not run again; one that is cancelled is not retried.
    ok = submit(server, alice, ["true"], max_retries=3)
    assert server.wait_state(ok, ("COMPLETED",))["restarts"] == 0
    bad = cli_as(server, alice, "submit", "--max-retries", "x", "--", "true")
    assert bad.returncode != 0 and "--max-retries" in bad.stderr


def test_requeue_as_scontrol_requeue(server: Server) -> None:
    alice, bob = make_user("alice", ("lab",)), make_user("bob")
    job = submit(server, alice, ["sh", "-c", 'echo "run $GPUWARDEN_RESTART_COUNT"; sleep 60'])
    server.wait_state(job, ("RUNNING",))
    refused = cli_as(server, bob, "requeue", str(job))
    assert refused.returncode == 2 and "only its owner or an admin" in refused.stderr
    done = cli_as(server, alice, "requeue", str(job))
    assert done.returncode == 0, done.stderr
    wait_for(lambda: server.job(job)["restarts"] == 1 or None, 30, "the job requeued")
    server.wait_state(job, ("RUNNING",))
    server.call(alice, "cancel", jobs=[job])
    server.wait_state(job, ("CANCELLED",))
    assert cli_as(server, alice, "requeue", str(job)).returncode == 0  # an ended one too
    server.wait_state(job, ("RUNNING",))
    wait_for(
        lambda: "run 2" in cli_as(server, alice, "logs", str(job)).stdout or None,
        30,
        "its third run",
    )
    assert server.job(job)["restarts"] == 2


def test_a_preemption_outlives_a_restart_of_the_service(server: Server) -> None:
    """The victim's signal is not sent again by a restarted service, which still kills
    it after the grace and queues it again."""
    alice, bob = make_user("alice", ("lab",)), make_user("bob")
    folder = server.work / "notes"
    folder.mkdir(mode=0o777)
    folder.chmod(0o777)
    argv = [USER_PY, "-c", JOB, str(folder), "stubborn"]
    victim = submit(server, alice, argv, request={"count": 8}, preemptible=True)
    server.wait_state(victim, ("RUNNING",))
    wait_for(lambda: notes(folder, victim), 30, "the job started")
    normal = submit(server, bob, ["sleep", "2"], request={"count": 1})
    wait_for(lambda: any(w == "term" for w, _ in notes(folder, victim)), 30, "its SIGTERM")
    server.kill(signal.SIGKILL)
    server.start()
    server.wait_state(normal, ("RUNNING", "COMPLETED"), timeout=GRACE + 30)
    row = server.job(victim)
    assert row["restarts"] == 1 and row["preemptions"] == 1, row
    wait_for(
        lambda: "start 1" in [w for w, _ in notes(folder, victim)] or None,
        30,
        lambda: f"its second run: {notes(folder, victim)}",
    )
    assert [w for w, _ in notes(folder, victim)].count("term") == 1
