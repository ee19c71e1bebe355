"""Job arrays and --param sweeps through the real queue service, as real users.

An array is one `gpuwarden submit --array` and many tasks, each an ordinary job of the
journal (docs/sweeps.md): these tests submit from the command line as a real user,
and read what each task did from the files it wrote.
"""

from __future__ import annotations

import json
import signal
import subprocess
from pathlib import Path
from typing import Any

import pytest

from hermetic import hermetic
from repo import SRC
from servicetools import USER_PY, Server, become, cli_as, serving
from users import make_user
from waiting import wait_for

TASK = (
    'echo "$GPUWARDEN_ARRAY_TASK_ID $SLURM_ARRAY_JOB_ID start $(date +%s.%N)" >> ran.log; '
    "sleep 0.4; "
    'echo "$GPUWARDEN_ARRAY_TASK_ID $SLURM_ARRAY_JOB_ID end $(date +%s.%N)" >> ran.log; '
    'echo "task $GPUWARDEN_ARRAY_TASK_ID"'
)


def tasks_of(srv: Server, array: int) -> list[dict[str, Any]]:
    """Every task of `array`, active or ended, as the service lists them."""
    rows = srv.call(None, "queue")["jobs"] + srv.call(None, "jobs", limit=5000)["jobs"]
    return [r for r in rows if r.get("array_job") == array]


def wait_tasks(srv: Server, array: int, count: int, states: tuple[str, ...]) -> list[Any]:
    """The array's `count` tasks once every one is in one of `states`."""
    rows: list[dict[str, Any]] = []

    def reached() -> list[dict[str, Any]]:
        rows[:] = tasks_of(srv, array)
        return list(rows) if len(rows) == count and all(r["state"] in states for r in rows) else []

    return wait_for(
        reached, 60, lambda: f"array {array}: {[(r['label'], r['state']) for r in rows]}"
    )


def most_at_once(lines: list[str]) -> int:
    events = []
    for line in lines:
        _, _, what, at = line.split()
        events.append((float(at), 1 if what == "start" else -1))
    most = now = 0
    for _, step in sorted(events, key=lambda e: (e[0], e[1])):
        now += step
        most = max(most, now)
    return most


def test_an_array_runs_each_task_once_within_its_throttle_across_a_restart(
    server: Server,
) -> None:
    alice = make_user("alice", ("lab",))
    work = Path(server.work)
    sub = cli_as(
        server, alice, "submit", "--array", "0-9%3", "--output", "%A_%a.out", "--",
        "sh", "-c", TASK,
    )  # fmt: skip
    assert sub.returncode == 0, sub.stderr
    array = int(sub.stdout)
    assert f"array {array} of 10 tasks" in sub.stderr
    wait_for(  # half of it has run, some of it is running
        lambda: sum(r["state"] == "COMPLETED" for r in tasks_of(server, array)) >= 4,
        30,
        lambda: f"4 of array {array}'s tasks completed: {tasks_of(server, array)}",
    )
    server.kill(signal.SIGKILL)  # a restart with the array half done
    server.start()
    rows = wait_tasks(server, array, 10, ("COMPLETED",))
    assert sorted(r["array_task"] for r in rows) == list(range(10))
    lines = (work / "ran.log").read_text().splitlines()
    starts = sorted(int(line.split()[0]) for line in lines if " start " in line)
    assert starts == list(range(10)), lines  # each task once, with its own id
    assert {line.split()[1] for line in lines} == {str(array)}
    assert most_at_once(lines) <= 3, lines  # never more than its throttle
    for row in rows:
        out = work / f"{array}_{row['array_task']}.out"
        assert out.read_text() == f"task {row['array_task']}\n"
        assert out.stat().st_uid == alice.uid


def test_one_cancel_ends_a_whole_array_and_queue_shows_it_compactly(server: Server) -> None:
    alice, bob = make_user("alice", ("lab",)), make_user("bob")
    sub = cli_as(server, alice, "submit", "--array", "0-19", "--", "sleep", "60")
    assert sub.returncode == 0, sub.stderr
    array = int(sub.stdout)
    wait_for(
        lambda: sum(r["state"] == "RUNNING" for r in tasks_of(server, array)) >= 4,
        30,
        lambda: f"4 of array {array}'s tasks running: {tasks_of(server, array)}",
    )
    shown = cli_as(server, bob, "queue").stdout
    assert f"{array}_[4-19]" in shown and f"{array}_0 " in shown, shown
    held = cli_as(server, alice, "hold", f"{array}_7")
    assert held.returncode == 0 and f"held: {array}_7" in held.stdout, held.stderr
    assert f"{array}_[4-6,8-19]" in cli_as(server, bob, "queue").stdout
    whole = cli_as(server, alice, "hold", str(array))  # every waiting task; running ones run
    assert whole.returncode == 0 and f"held: {array}" in whole.stdout, whole.stderr
    waiting = [r for r in tasks_of(server, array) if r["state"] == "PENDING"]
    assert len(waiting) == 16 and all(r["held"] for r in waiting)
    assert cli_as(server, alice, "unhold", str(array)).returncode == 0
    assert not any(r["held"] for r in tasks_of(server, array) if r["state"] == "PENDING")
    refused = cli_as(server, bob, "cancel", str(array))
    assert refused.returncode == 2 and "only its owner or an admin" in refused.stderr
    one = cli_as(server, alice, "cancel", f"{array}_19")
    assert one.returncode == 0 and f"cancelled: {array}_19" in one.stdout, one.stderr
    done = cli_as(server, alice, "cancel", str(array))
    assert done.returncode == 0 and f"cancelled: {array}" in done.stdout, done.stderr
    rows = wait_tasks(server, array, 20, ("CANCELLED",))
    assert len(rows) == 20
    again = cli_as(server, alice, "cancel", str(array))
    assert again.returncode == 2 and "every task of array" in again.stderr


@pytest.fixture
def limited(tmp_path: Path, open_dir: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    yield from serving(tmp_path, open_dir, monkeypatch, "--max-jobs-per-user", "3")


def test_a_sweep_puts_each_combination_in_its_tasks_environment(limited: Server) -> None:
    alice = make_user("alice", ("lab",))
    work = Path(limited.work)
    over = cli_as(
        limited, alice, "submit", "--param", "lr=0.1,0.01", "--param", "seed=1,2", "--", "true"
    )
    assert over.returncode == 2 and over.stderr == (
        "gpuwarden submit: this array has 4 tasks; with the 0 jobs you have queued or "
        "running that is over the 3 allowed (max_jobs_per_user)\n"
    ), over.stderr
    sub = cli_as(
        limited, alice, "submit", "--param", "lr=0.1,0.01", "--array", "%1", "--",
        "sh", "-c", 'echo "$GPUWARDEN_PARAM_LR $SLURM_ARRAY_TASK_COUNT" > "lr-$GPUWARDEN_PARAM_LR"',
    )  # fmt: skip
    assert sub.returncode == 0, sub.stderr
    wait_tasks(limited, int(sub.stdout), 2, ("COMPLETED",))
    assert (work / "lr-0.1").read_text() == "0.1 2\n"
    assert (work / "lr-0.01").read_text() == "0.01 2\n"
    for spec, said in (("0-", "not a task id"), ("5-1", "ends before"), ("%0", "from 1 to")):
        bad = cli_as(limited, alice, "submit", "--array", spec, "--", "true")
        assert bad.returncode == 2 and said in bad.stderr and bad.stderr.count("\n") == 1


STDIN_CLIENT = """
import json, sys
from gpuwarden.queueclient.client import require
with require(sys.argv[1]) as c:
    print(json.dumps(c.call(sys.argv[2], **json.load(sys.stdin))))
"""


def _call_from_stdin(srv: Server, who: Any, op: str, **fields: Any) -> dict[str, Any]:
    """`op` as `who` with fields too large for a command line's argument."""
    done = subprocess.run(
        [USER_PY, "-c", STDIN_CLIENT, srv.socket, op],
        input=json.dumps(fields),
        env={**hermetic(), "PYTHONPATH": str(SRC), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=120,
        preexec_fn=become(who),
        cwd=str(srv.work),
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return dict(json.loads(done.stdout))


def _journal_bytes(srv: Server) -> int:
    base = Path(srv.state) / "jobs.db"
    return sum(p.stat().st_size for p in (base, Path(f"{base}-wal")) if p.exists())


def test_a_ten_thousand_task_sweep_stores_its_values_once(server: Server) -> None:
    """A sweep's 128 KiB of values and environment are written once, not per task:
    10,000 tasks add under 10 MB of journal, and each task still gets its own values
    (and its output path its own ids)."""
    carol = make_user("carol")  # an admin: no per-user job limit
    import random
    import string

    pick = random.Random(35)

    def values(n: int, k: int) -> str:
        return ",".join("".join(pick.choices(string.ascii_letters, k=k)) for _ in range(n))

    swept = [f"{name}={values(10, 400)}" for name in "abcd"]  # 10,000 combinations
    fixed = [f"f{i}={values(1, 4000)}" for i in range(28)]  # one value each: 112 KB
    params = swept + fixed
    env = {"PATH": "/usr/bin:/bin", "BIG": "x" * 8192}
    before = _journal_bytes(server)
    fields = {"argv": ["true"], "cwd": str(server.work), "env": env, "params": params}
    reply = _call_from_stdin(server, carol, "submit", hold=True, **fields)
    assert reply.get("tasks") == 10_000, reply
    added = _journal_bytes(server) - before

    assert added < 10 * 2**20, f"the sweep added {added / 2**20:.1f} MB of journal"
    ids = reply["ids"]
    from gpuwarden.service import store as st

    journal = st.Store(str(Path(server.state) / "jobs.db"))
    try:
        last = journal.get(ids[-1])
        assert last is not None
        assert last.params == {p.split("=")[0]: p.split("=")[1].split(",")[-1] for p in params}
        assert last.env["BIG"] == "x" * 8192 and last.argv == ("true",)
        assert last.output == f"{server.work}/gpuwarden-{ids[0]}_9999.out"
    finally:
        journal.close()
    assert server.call(carol, "cancel", jobs=[ids[0]]).get("ok")
