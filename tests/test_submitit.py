"""submitit's own AutoExecutor on the queue service (gpuwarden.submitit), as a real user.

submitit comes from PyPI (the test dependency group) and finds the executor through
its plugin API (the `submitit` entry points in pyproject.toml); the script below is
what a user writes for Slurm, with `cluster="gpuwarden"`.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuwarden.service.identity import Person
from hermetic import hermetic
from repo import SRC
from servicetools import USER_PY, Server, become, serving, submit
from users import make_user
from waiting import wait_for

SCRIPT = r"""
import json, sys, time
import submitit

def square(x):
    return x * x

def boom():
    raise ValueError("boom from the job")

def nap():
    time.sleep(60)

def state(job, wanted):
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        now = job.watcher.get_state(job.job_id, mode="force")
        if now in wanted:
            return now
        time.sleep(0.1)
    return now

executor = submitit.AutoExecutor(sys.argv[1], cluster="gpuwarden")
executor.update_parameters(
    timeout_min=5, gpus_per_node=1, slurm_array_parallelism=2, gpuwarden_array_parallelism=2
)
jobs = executor.map_array(square, range(8))
out = {"ids": [j.job_id for j in jobs], "results": [j.result() for j in jobs]}
# `job.state` as a user polls it (no forced read): COMPLETED soon after the result,
# not after submitit's 60 s cache of a watcher that has been running for a while.
one = executor.submit(square, 3)
# As after a long sweep: submitit's own watcher then reads states once a minute (its
# delay grows with the time since the last job was registered).
one.watcher._start_time = time.time() - 600
assert one.result() == 9
back, calls = time.monotonic(), one.watcher.num_calls
seen = []
while time.monotonic() - back < 30 and one.state != "COMPLETED":
    seen.append(one.state)
    time.sleep(0.05)
out["completed_after"] = [time.monotonic() - back, one.state, sorted(set(seen))]
out["reads"] = one.watcher.num_calls - calls
bad = executor.submit(boom)
try:
    bad.result()
except submitit.core.utils.FailedJobError as err:
    out["error"] = str(err)
out["bad"] = state(bad, ("FAILED",))
class Twice(submitit.helpers.Checkpointable):
    # Its first run outlives the time before its checkpoint; the run it is requeued as ends.
    def __init__(self):
        self.runs = 0

    def __call__(self):
        self.runs += 1
        if self.runs == 1:
            time.sleep(60)
        return self.runs

executor.update_parameters(timeout_min=1, gpuwarden_signal_delay_s=58)
again = executor.submit(Twice())
out["requeued"] = [again.job_id, again.result()]
executor.update_parameters(timeout_min=5)
sleepy = executor.submit(nap)
out["running"] = state(sleepy, ("RUNNING",))
sleepy.cancel()
out["cancelled"] = state(sleepy, ("CANCELLED",))
print(json.dumps(out))
"""


@pytest.fixture
def server(tmp_path: Path, open_dir: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Server]:
    pytest.importorskip("submitit")
    yield from serving(tmp_path, open_dir, monkeypatch)


def _as_user(server: Server, who: Person, script: str, *args: str) -> subprocess.Popen[str]:
    """`script` run by `who`'s own Python (root's interpreter is not theirs to run) with
    submitit and gpuwarden's entry points from the test environment's packages."""
    import submitit

    found = subprocess.run(
        [USER_PY, "-c", "import sys; print(sys.version_info[:2])"],
        text=True,
        capture_output=True,
        check=True,
    ).stdout.strip()
    if found != str(sys.version_info[:2]):
        pytest.skip(f"{USER_PY} is Python {found}, not the test environment's")
    packages = str(Path(submitit.__file__).resolve().parent.parent)
    env = {
        **hermetic(),
        "PATH": "/usr/bin:/bin",
        "GPUWARDEN_SOCKET": server.socket,
        "HOME": who.home,
        "PYTHONPATH": f"{SRC}:{packages}",
    }
    return subprocess.Popen(
        [USER_PY, "-c", script, *args],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=become(who),
        cwd=str(server.work),
    )


#: A checkpointable call on all four GPUs, preemptible: its first run waits to be
#: preempted; the run after its checkpoint returns how many runs it took.
PREEMPTED = r"""
import json, os, sys, time
import submitit

class Resumable(submitit.helpers.Checkpointable):
    def __init__(self, flag):
        self.flag = flag
        self.runs = 0

    def __call__(self):
        self.runs += 1
        if self.runs == 1:
            with open(self.flag, "w") as f:
                f.write(os.environ["GPUWARDEN_JOB"])
            time.sleep(120)
        return [self.runs, os.environ["GPUWARDEN_RESTART_COUNT"]]

executor = submitit.AutoExecutor(sys.argv[1], cluster="gpuwarden")
executor.update_parameters(timeout_min=30, gpus_per_node=4, gpuwarden_preemptible=True)
job = executor.submit(Resumable(sys.argv[2]))
print(json.dumps({"id": job.job_id, "result": job.result()}))
"""


def test_a_checkpointable_call_resumes_from_its_checkpoint_after_preemption(
    server: Server,
) -> None:
    alice, bob = make_user("alice", ("lab",)), make_user("bob")
    flag = server.work / "first-run"
    proc = _as_user(server, alice, PREEMPTED, str(server.work / "runs"), str(flag))
    try:
        wait_for(lambda: flag.exists() and flag.read_text(), 60, "the first run")
        job = int(flag.read_text())
        assert server.job(job)["preemptible"]
        normal = submit(server, bob, ["sleep", "1"], request={"count": 4})
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err[-3000:]
    result = json.loads(out.strip().splitlines()[-1])
    assert result == {"id": str(job), "result": [2, "1"]}  # resumed, in its second run
    row = server.job(job)
    assert row["state"] == "COMPLETED" and row["preemptions"] == 1, row
    assert server.job(normal)["state"] == "COMPLETED"


def test_submitit_map_array_results_exceptions_and_cancel_through_the_service(
    server: Server,
) -> None:
    alice = make_user("alice", ("lab",))
    import submitit

    # The user's own Python (root's interpreter is not theirs to run) with submitit and
    # gpuwarden's entry points from the test environment's packages.
    found = subprocess.run(
        [USER_PY, "-c", "import sys; print(sys.version_info[:2])"],
        text=True,
        capture_output=True,
        check=True,
    ).stdout.strip()
    if found != str(sys.version_info[:2]):
        pytest.skip(f"{USER_PY} is Python {found}, not the test environment's")
    packages = str(Path(submitit.__file__).resolve().parent.parent)
    env = {
        **hermetic(),
        "PATH": "/usr/bin:/bin",
        "GPUWARDEN_SOCKET": server.socket,
        "HOME": alice.home,
        "PYTHONPATH": f"{SRC}:{packages}",
    }
    done = subprocess.run(
        [USER_PY, "-c", SCRIPT, str(Path(server.work) / "runs")],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        preexec_fn=become(alice),
        cwd=str(server.work),
    )
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["results"] == [x * x for x in range(8)]
    array = out["ids"][0].split("_")[0]
    assert out["ids"] == [f"{array}_{i}" for i in range(8)]
    tasks = [r for r in server.call(None, "jobs", limit=100)["jobs"] if r.get("array_job")]
    assert len(tasks) == 8 and {r["array_throttle"] for r in tasks} == {2}
    assert {r["user"] for r in tasks} == {"gw-alice"}
    assert "ValueError: boom from the job" in out["error"] and out["bad"] == "FAILED"
    assert out["running"] == "RUNNING" and out["cancelled"] == "CANCELLED"
    after, state, before = out["completed_after"]
    assert state == "COMPLETED" and after < 2.0, out["completed_after"]
    assert set(before) <= {"RUNNING"}, before
    # One read of the service per REFRESH_S at most while polling, not one per poll.
    assert out["reads"] <= after / 0.5 + 2, (out["reads"], after)
    job, runs = out["requeued"]
    assert runs == 2  # checkpointed, requeued under its id, resumed from the checkpoint
    assert server.job(int(job))["state"] == "COMPLETED"
    assert f"job {job} requeued" in server.log.read_text()


OPEN_FOLDER = r"""
import json, sys
import submitit

executor = submitit.AutoExecutor(sys.argv[1], cluster="gpuwarden")
executor.update_parameters(timeout_min=5, gpus_per_node=1)
job = executor.submit(int, "7")
try:
    print(json.dumps({"result": job.result()}))
except submitit.core.utils.UncompletedJobError as err:
    print(json.dumps({"error": str(err)}))
"""


def test_a_pickle_in_a_folder_others_can_write_is_refused(server: Server) -> None:
    """Job ids are sequential: in a folder others may write, another user could put
    the next job's pickle in advance. As ssh's StrictModes, the job refuses to unpickle,
    and says why where submitit shows it."""
    alice = make_user("alice", ("lab",))
    import submitit

    shared = Path(server.work) / "shared"
    shared.mkdir()
    shared.chmod(0o777)  # a lab folder anyone may write, without the sticky bit
    packages = str(Path(submitit.__file__).resolve().parent.parent)
    env = {
        **hermetic(),
        "PATH": "/usr/bin:/bin",
        "GPUWARDEN_SOCKET": server.socket,
        "HOME": alice.home,
        "PYTHONPATH": f"{SRC}:{packages}",
    }
    done = subprocess.run(
        [USER_PY, "-c", OPEN_FOLDER, str(shared / "runs")],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        preexec_fn=become(alice),
        cwd=str(server.work),
    )
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert "error" in out, out
    assert "refusing to run the job" in out["error"], out["error"]
    assert f"the directory {shared} is writable by others" in out["error"], out["error"]


def test_a_pickle_not_the_submitters_is_refused(tmp_path: Path) -> None:
    from gpuwarden.config.trust import owned_refusal

    folder = tmp_path / "runs"
    folder.mkdir()
    pickle = folder / "12_submitted.pkl"
    pickle.write_bytes(b"")
    assert owned_refusal(str(pickle), "the submitted pickle") is None
    os.chown(pickle, 4242, 4242)  # another user's, made in advance
    why = owned_refusal(str(pickle), "the submitted pickle")
    assert why is not None and "is owned by uid 4242, not by you" in why
    os.chown(pickle, 0, 0)
    pickle.chmod(0o666)
    assert "writable by others" in (owned_refusal(str(pickle), "the pickle") or "")
