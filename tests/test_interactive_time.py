"""A time for everything that holds GPUs through the queue service: `gpuwarden.lease(time=)`,
`kernel install --time` (carried by the kernelspec to the provisioner), `reserve --for`
and an attached `run`, under an admin's `max_time`, `interactive_time` and
`max_interactive_time`; each refusal names the option that fixes it. As a real non-root
user, against a real root service."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from components import require
from repo import SRC
from servicetools import USER_PY, Server, become, cli_as, serving
from shells import exports
from users import make_user

LEASE = """
import json, sys, gpuwarden
from gpuwarden.base.errors import UserError
kw = json.loads(sys.argv[1])
try:
    with gpuwarden.lease(n=1, **kw) as held:
        print(json.dumps({"job": held.job, "visible": held.visible}))
except UserError as err:
    print("ERROR " + str(err))
"""


@pytest.fixture
def timed(tmp_path: Path, open_dir: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Server]:
    """A service whose jobs need a time of at most an hour (the docs' example sets one)."""
    conf = open_dir / "config.toml"
    conf.write_text('[service]\nmax_time = "1h"\n')
    conf.chmod(0o644)
    monkeypatch.setenv("GPUWARDEN_SYSTEM_CONFIG", str(conf))
    yield from serving(tmp_path, open_dir, monkeypatch)


def _as_user(srv: Server, who, python: str, *args: str, **extra: str):  # type: ignore[no-untyped-def]
    from gpuwarden.sim.fake import real_pynvml_path

    lib = srv.work.parent / "lib"
    if not lib.exists():
        lib.mkdir(mode=0o755)
        import shutil

        shutil.copy(real_pynvml_path(), lib / "pynvml.py")
    env = {
        "PYTHONPATH": f"{SRC}:{lib}",
        "PATH": "/usr/bin:/bin",
        "HOME": str(srv.work),
        "GPUWARDEN_SOCKET": srv.socket,
        "GPUWARDEN_SIM": srv.spec,
        "GPUWARDEN_LEASE_DIR": os.environ["GPUWARDEN_LEASE_DIR"],
        "GPUWARDEN_SYSTEM_CONFIG": os.environ["GPUWARDEN_SYSTEM_CONFIG"],
        **extra,
    }
    return subprocess.run(
        [python, *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        preexec_fn=become(who),
        cwd=str(srv.work),
    )


def _lease(srv: Server, who, **kw: object) -> dict:  # type: ignore[no-untyped-def]
    done = _as_user(srv, who, USER_PY, "-c", LEASE, json.dumps(kw))
    assert done.returncode == 0, done.stderr
    out = done.stdout.strip()
    return {"error": out[6:]} if out.startswith("ERROR ") else json.loads(out)


def _ended(srv: Server, job: str) -> dict:  # type: ignore[no-untyped-def]
    return srv.wait_state(int(job), ("COMPLETED", "CANCELLED", "FAILED", "TIMEOUT"))


def test_a_lease_and_an_attached_run_carry_a_time_and_a_refusal_names_the_option(
    timed: Server,
) -> None:
    alice = make_user("alice", ("lab",))
    refused = _lease(timed, alice)
    assert refused == {
        "error": "this machine needs gpuwarden.lease(time=...) on every job, at most 1h00m "
        "(max_time)"
    }
    over = _lease(timed, alice, time="2h")
    assert over["error"] == (
        "gpuwarden.lease(time=...) 2h00m is over this machine's limit of 1h00m (max_time)"
    )
    held = _lease(timed, alice, time="30m")
    assert "error" not in held, held
    assert _ended(timed, held["job"])["time_limit"] == 1800
    assert _lease(timed, alice, time=600.0)["job"]
    bad = _lease(timed, alice, time="soon")
    assert bad["error"].startswith("invalid time 'soon'"), bad
    run = cli_as(timed, alice, "run", "--", "true")  # an attached run is refused the same way
    assert "needs --time on every job" in run.stderr

    # The admin's rule for interactive holds: a default, and a maximum of their own.
    conf = Path(os.environ["GPUWARDEN_SYSTEM_CONFIG"])
    conf.write_text(
        '[service]\nmax_time = "1h"\ninteractive_time = "20m"\nmax_interactive_time = "2h"\n'
        '[service.limits]\n"@gw-lab" = { max_interactive_time = "10m" }\n'
    )
    reload = timed.call(None, "reload")
    assert "error" not in reload, reload
    assert "interactive_time: - -> 20m00s" in timed.log.read_text()
    bob = make_user("bob")
    given = _lease(timed, bob)  # none asked: the default
    assert _ended(timed, given["job"])["time_limit"] == 1200
    assert _ended(timed, _lease(timed, bob, time="90m")["job"])["time_limit"] == 5400
    capped = _lease(timed, alice)  # the group's maximum cuts the default
    assert _ended(timed, capped["job"])["time_limit"] == 600
    assert _lease(timed, alice, time="15m")["error"].endswith(
        "over this machine's limit of 10m00s (service.limits @gw-lab max_interactive_time)"
    )
    attached = cli_as(timed, bob, "run", "--", "true")
    assert attached.returncode == 0, attached.stderr
    reserved = _as_user(timed, bob, USER_PY, "-m", "gpuwarden", "reserve", "-g", "1")
    assert reserved.returncode == 0, reserved.stderr  # none asked: the default, shown
    rid = exports(reserved.stdout)["GPUWARDEN_RESERVATION"]
    assert timed.wait_state(int(rid), ("RUNNING",))["time_limit"] == 1200
    assert " until " in reserved.stderr and "until released" not in reserved.stderr
    released = _as_user(timed, bob, USER_PY, "-m", "gpuwarden", "release", rid)
    assert released.returncode == 0, released.stderr
    batch = cli_as(timed, bob, "submit", "--", "true")  # batch jobs keep max_time's rule
    assert "needs --time on every job, at most 1h00m (max_time)" in batch.stderr


def test_reserve_holds_through_the_service_with_for_as_its_time(timed: Server) -> None:
    """`reserve --for` under a service: an allocation of the student's in `queue` with
    `--for` as its time, refused in the option's own words; `run` in the reserved shell
    uses its GPU; `release` (or the holder's death, or its time) ends it."""
    import gpuwarden.leases as leases
    from gpuwarden.queueclient.holding import RESERVATION

    alice = make_user("alice", ("lab",))

    def gw(*args: str, **extra: str) -> subprocess.CompletedProcess[str]:
        return _as_user(timed, alice, USER_PY, "-m", "gpuwarden", *args, **extra)

    refused = gw("reserve", "-g", "1")
    assert (refused.returncode, refused.stdout) == (2, ""), refused.stderr
    assert refused.stderr == (
        "gpuwarden reserve: this machine needs `gpuwarden reserve --for` on every job, "
        "at most 1h00m (max_time)\n"
    )
    over = gw("reserve", "-g", "1", "--for", "2h")
    assert over.returncode == 2 and over.stderr == (
        "gpuwarden reserve: `gpuwarden reserve --for` 2h00m is over this machine's limit "
        "of 1h00m (max_time)\n"
    )
    held = gw("reserve", "-g", "1", "--for", "30m")
    assert held.returncode == 0, held.stderr
    env = exports(held.stdout)
    job = env["GPUWARDEN_RESERVATION"]
    assert env["GPUWARDEN_JOB"] == job
    row = timed.wait_state(int(job), ("RUNNING",))
    assert (row["user"], row["time_limit"], row["command"]) == (alice.name, 1800, RESERVATION)
    [lease] = leases.list_leases()
    assert (lease.job, lease.user, str(lease.index)) == (
        job,
        alice.name,
        env["CUDA_VISIBLE_DEVICES"],
    )
    assert f"holding GPU {lease.index} until " in held.stderr, held.stderr
    inner = gw("run", "-g", "1", "--", "sh", "-c", "echo $CUDA_VISIBLE_DEVICES", **env)
    assert (inner.returncode, inner.stdout) == (0, env["CUDA_VISIBLE_DEVICES"] + "\n"), inner.stderr

    done = gw("release")  # the only one: found without naming it
    assert done.returncode == 0 and done.stdout == "", done.stderr
    assert done.stderr == f"gpuwarden release: released GPU {lease.index} (reservation {job})\n"
    assert _ended(timed, job)["state"] == "CANCELLED"
    assert leases.list_leases() == []
    again = gw("release", **env)  # the shell still names it: eval clears its variables
    assert again.returncode == 0 and again.stdout.startswith("unset CUDA_VISIBLE_DEVICES")
    assert "GPUWARDEN_JOB" in again.stdout and "has ended already" in again.stderr
    assert (
        gw("release").stderr
        == "gpuwarden release: you hold no reservation (see `gpuwarden queue`)\n"
    )

    killed = gw("reserve", "-g", "1", "--for", "30m")
    assert killed.returncode == 0, killed.stderr
    found = re.search(r"holder pid (\d+)", killed.stderr)
    assert found is not None, killed.stderr
    os.kill(int(found[1]), signal.SIGKILL)  # its connection closes: the service cancels
    assert _ended(timed, exports(killed.stdout)["GPUWARDEN_RESERVATION"])["state"] == "CANCELLED"

    short = gw("reserve", "-g", "1", "--for", "2s")
    assert short.returncode == 0, short.stderr
    ended = _ended(timed, exports(short.stdout)["GPUWARDEN_RESERVATION"])
    assert (ended["time_limit"], ended["state"]) == (2, "TIMEOUT"), ended
    assert leases.list_leases() == []

    # Every GPU reserved: another student is refused at once (exit 75) or gives up
    # after --timeout in line, and may not end the reservation of another.
    everything = gw("reserve", "-g", "4", "--for", "30m")
    assert everything.returncode == 0, everything.stderr
    theirs = exports(everything.stdout)["GPUWARDEN_RESERVATION"]
    bob = make_user("bob")

    def as_bob(*args: str) -> subprocess.CompletedProcess[str]:
        return _as_user(timed, bob, USER_PY, "-m", "gpuwarden", *args)

    busy = as_bob("reserve", "-g", "1", "--for", "10m")
    assert (busy.returncode, busy.stdout) == (75, ""), busy.stderr
    assert len(busy.stderr.splitlines()) == 1, busy.stderr
    waited = as_bob("reserve", "-g", "1", "--for", "10m", "--wait", "--timeout", "2s")
    assert (waited.returncode, waited.stdout) == (75, ""), waited.stderr
    assert "after waiting 2s for GPUs" in waited.stderr, waited.stderr
    other = as_bob("release", theirs)
    assert other.returncode == 2 and other.stderr == (
        f"gpuwarden release: job {theirs} belongs to {alice.name}: only its owner or an admin "
        "may cancel it\n"
    )
    assert timed.job(int(theirs))["state"] == "RUNNING"
    assert gw("release", theirs).returncode == 0
    assert [r["state"] for r in timed.call(None, "queue")["jobs"]] == []


def test_a_kernel_carries_its_time_from_the_kernelspec_to_the_service(
    timed: Server, cli, sim, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`kernel install --time` writes the time into the kernelspec; the provisioner asks
    the service for it (root here: the refusal as a user is the one above, in the
    provisioner's words, `test_a_refusal_names_the_kernels_option`)."""
    import importlib.util

    require(
        all(importlib.util.find_spec(m) for m in ("jupyter_client", "ipykernel")),
        "jupyter_client and ipykernel (the test dependency group)",
    )
    from jupyter_client import KernelManager

    sim(timed.spec)
    data = timed.work.parent / "jupyter"
    monkeypatch.setenv("JUPYTER_DATA_DIR", str(data))
    monkeypatch.setenv("JUPYTER_PLATFORM_DIRS", "1")
    monkeypatch.setenv("GPUWARDEN_SOCKET", timed.socket)
    bad = cli("kernel", "install", "--time", "soon", "--name", "timed")
    assert bad.returncode == 2 and "invalid --time 'soon'" in bad.stderr, bad.stderr
    done = cli("kernel", "install", "--time", "45m", "--name", "timed")
    assert done.returncode == 0, done.stderr
    spec = json.loads((data / "kernels" / "timed" / "kernel.json").read_text())
    assert spec["metadata"]["kernel_provisioner"]["config"]["time_limit"] == 2700
    km = KernelManager(kernel_name="timed")
    km.start_kernel()
    try:
        job = os.environ.get("GPUWARDEN_JOB")
        assert job is None
        rows = timed.call(None, "queue")["jobs"]
        assert [r["time_limit"] for r in rows] == [2700], rows
    finally:
        km.shutdown_kernel(now=True)


def test_a_refusal_names_the_kernels_option() -> None:
    from gpuwarden.queueclient.holding import _in_own_words

    option = "`gpuwarden kernel install --time`"
    said = _in_own_words("this machine needs --time on every job, at most 1h00m (max_time)", option)
    assert said == f"this machine needs {option} on every job, at most 1h00m (max_time)"
    over = _in_own_words("--time 2h00m is over this machine's limit of 1h00m (max_time)", option)
    assert over.startswith(f"{option} 2h00m is over")
    assert _in_own_words("no GPU fits", option) == "no GPU fits"


def test_limits_read_as_written() -> None:
    """A small GPU-hour budget is not "used 0.0 of your 0.01"; a reload says durations
    as durations; an interactive job falls under max_interactive_time."""
    from gpuwarden.service.limits import Limit, refusal
    from gpuwarden.service.settings import Settings, changes

    budget = {"gpu_hours_per_week": Limit(0.01, "service.limits @gw-lab gpu_hours_per_week")}
    said = refusal(budget, gpus=1, time_limit=60.0, gpu_hours=0.012)
    assert said is not None and said.startswith("you used 0.012 of your 0.01 GPU-hours")
    old = Settings(socket="s", state_dir="d")
    new = Settings(socket="s", state_dir="d", max_time=86400.0, interactive_time=1800.0)
    assert changes(old, new) == ["max_time: - -> 24h00m", "interactive_time: - -> 30m00s"]
    both = {"max_time": Limit(3600.0, "max_time"), "max_interactive_time": Limit(600.0, "m")}
    assert refusal(both, gpus=1, time_limit=1200.0) is None
    over = refusal(both, gpus=1, time_limit=1200.0, interactive=True)
    assert over is not None and "limit of 10m00s (m)" in over
