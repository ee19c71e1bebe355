"""Who used what, and how well, through the service: `report` (as sreport) and `eff` (as
seff) as users type them, over jobs whose GPUs, times and loads are known.

The real service of tests/servicetools.py, sampling every second; the jobs load their
GPUs with `gpuwarden sim occupy` on the simulated machine the service reads (its state
in a folder every user may write, so a job of gw-alice's changes what the root
service sees).
"""

from __future__ import annotations

import contextlib
import csv
import io
import json
import os
import re
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpuwarden.cli import main
from gpuwarden.cli.jobtables import span
from gpuwarden.web.usage import window as usage_window
from repo import SRC
from schemas import validate
from servicetools import SPEC, Server, cli_as, serving, submit
from users import make_user
from waiting import wait_for

TWO_ACCOUNTS = """
[service.accounts]
vision = { members = ["gw-alice"] }
nlp = { members = ["gw-bob"] }
"""


@pytest.fixture
def sampled(tmp_path: Path, open_dir: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Server]:
    """The service sampling its jobs' GPUs every second, on a simulated machine whose
    state the jobs may change; gw-alice's jobs charged to account vision, gw-bob's to nlp."""
    conf = open_dir / "config.toml"
    conf.write_text(TWO_ACCOUNTS)
    monkeypatch.setenv("GPUWARDEN_SYSTEM_CONFIG", str(conf))
    sim = open_dir / "sim"
    sim.mkdir(mode=0o1777)
    sim.chmod(0o1777)
    monkeypatch.setenv("GPUWARDEN_SIM_STATE", str(sim))
    monkeypatch.setenv("GPUWARDEN_SERVICE_SAMPLE_SECONDS", "1")
    yield from serving(tmp_path, open_dir, monkeypatch)


def job_env(srv: Server) -> dict[str, str]:
    """What a job needs to run `gpuwarden sim occupy` on the service's machine."""
    return {
        "PATH": "/usr/bin:/bin",
        "PYTHONPATH": str(SRC),
        "GPUWARDEN_SIM": SPEC,
        "GPUWARDEN_SIM_STATE": os.environ["GPUWARDEN_SIM_STATE"],
    }


def occupying(util: int, seconds: int, mem: str = "30GiB") -> list[str]:
    """A job's command: load its first GPU at `util` percent for `seconds`, holding `mem`
    (one user's jobs only: the simulator's state file is its writer's)."""
    gpu = "${CUDA_VISIBLE_DEVICES%%,*}"
    return [
        "sh",
        "-c",
        f"exec python3 -m gpuwarden sim occupy --gpu {gpu} --mem {mem} --util {util} "
        f"-- sleep {seconds}",
    ]


def report_csv(srv: Server, who: object, *args: str) -> dict[str, dict[str, str]]:
    done = cli_as(srv, who, "report", "--format", "csv", "--since", "1h", *args)  # type: ignore[arg-type]
    assert done.returncode == 0, done.stderr
    rows = list(csv.DictReader(io.StringIO(done.stdout)))
    key = next(k for k in rows[0] if k not in ("period",)) if rows else "user"
    return {r[key]: r for r in rows}


def test_report_by_user_and_account_and_eff_of_a_job_that_loads_one_of_its_two_gpus(
    sampled: Server,
) -> None:
    srv = sampled
    alice, bob = make_user("alice", ("lab",)), make_user("bob")
    env = job_env(srv)
    two = submit(srv, alice, occupying(80, 15), request={"count": 2}, env=env)
    one = submit(srv, bob, ["sleep", "5"], request={"count": 1})
    ended = {j: srv.wait_state(j, ("COMPLETED", "FAILED"), timeout=60) for j in (two, one)}
    outputs = [Path(srv.work, f"gpuwarden-{j}.out") for j in (two, one)]
    said = [p.read_text() if p.exists() else "" for p in outputs]
    assert {r["state"] for r in ended.values()} == {"COMPLETED"}, (ended, said)

    # GPU-hours by user: the GPUs each held x the time each ran, within 5%.
    rows = report_csv(srv, bob, "--by", "user")
    expect = {"gw-alice": 2 * ended[two]["elapsed"], "gw-bob": 1 * ended[one]["elapsed"]}
    for user, seconds in expect.items():
        assert float(rows[user]["gpu_hours"]) == pytest.approx(seconds / 3600, rel=0.05), rows
        assert rows[user]["jobs"] == "1" and rows[user]["runs"] == "1"
    assert float(rows["gw-alice"]["mean_wait_s"]) >= 0
    # and by account: each user's only account, the same GPU-hours
    rows = report_csv(srv, bob, "--by", "account")
    assert set(rows) == {"vision", "nlp"}, rows
    for account, user in (("vision", "gw-alice"), ("nlp", "gw-bob")):
        assert float(rows[account]["gpu_hours"]) == pytest.approx(expect[user] / 3600, rel=0.05), (
            rows
        )
        assert rows[account]["jobs"] == "1"

    # eff: about 80% on the GPU it loaded, 0% on the other, and flagged.
    eff = cli_as(srv, alice, "eff", "--json", str(two))
    assert eff.returncode == 0, eff.stderr
    (job,) = validate("eff", eff.stdout)
    (run,) = job["runs"]
    loaded = ended[two]["gpus"][0]
    uses = {u["gpu"]: u for u in run["use"]}
    assert set(uses) == set(ended[two]["gpus"]), run
    busy = uses[loaded]
    idle = uses[next(g for g in uses if g != loaded)]
    # 80% while the load ran; the mean also counts the job's start (a Python starting)
    assert busy["util_seconds"] / busy["busy_seconds"] == pytest.approx(80, abs=2), busy
    assert busy["util_seconds"] / busy["seconds"] == pytest.approx(80, abs=12), busy
    assert idle["util_seconds"] == 0 and idle["busy_seconds"] == 0, idle
    assert busy["mem_peak"] >= 30 << 30 and busy["mem_total"] == 80 << 30, busy
    assert busy["energy"] > 0 and busy["level"] == "gpu"
    said = cli_as(srv, alice, "eff", str(two))
    index = job["indices"][loaded]
    shown = re.search(rf"GPU {index}: utilisation (\d+)%", said.stdout)
    assert shown and 68 <= int(shown.group(1)) <= 82, said.stdout
    assert "was never used" in said.stdout, said.stdout
    refused = cli_as(srv, bob, "eff", str(two))
    assert refused.returncode == 2 and "only its owner or an admin" in refused.stderr

    # The waste: alice's idle GPU, told to her and to an admin; bob sees only his own.
    carol = make_user("carol")
    waste = cli_as(srv, carol, "report", "--waste", "--format", "json", "--since", "1h")
    assert waste.returncode == 0, waste.stderr
    by_user = {r["name"]: r for r in json.loads(waste.stdout)}
    assert by_user["gw-alice"]["gpus_idle"] == 1, by_user
    assert by_user["gw-alice"]["idle_hours"] > 0.4 * by_user["gw-alice"]["held_hours"]
    own = cli_as(srv, bob, "report", "--waste", "--format", "json", "--since", "1h")
    assert {r["name"] for r in json.loads(own.stdout)} == {"gw-bob"}, own.stdout


def test_every_run_of_a_requeued_job_is_counted(sampled: Server) -> None:
    srv = sampled
    alice = make_user("alice", ("lab",))
    job = submit(srv, alice, ["sleep", "3"], request={"count": 1})
    srv.wait_state(job, ("RUNNING",))
    assert srv.call(alice, "requeue", job=job)["ok"]
    srv.wait_log(f"job {job} requeued")
    row = srv.wait_state(job, ("COMPLETED",), timeout=60)
    # both runs: the first lasted from RUNNING to the requeue, however short under load
    assert row["runs"] == 2 and row["run_seconds"] > row["elapsed"], row
    assert row["gpu_seconds"] == pytest.approx(row["run_seconds"], rel=0.01)
    rows = report_csv(srv, alice, "--by", "job")
    assert rows[str(job)]["runs"] == "2" and rows[str(job)]["jobs"] == "1", rows
    assert float(rows[str(job)]["gpu_hours"]) == pytest.approx(row["run_seconds"] / 3600, rel=0.05)
    history = cli_as(srv, alice, "jobs", "--me")
    line = next(x for x in history.stdout.splitlines() if x.split()[:1] == [str(job)])
    assert f" {span(row['run_seconds'])} " in line, history.stdout  # both runs, not the last


def test_the_journal_is_read_directly_by_root_also_while_the_service_is_down(
    sampled: Server,
) -> None:
    srv = sampled
    alice = make_user("alice", ("lab",))
    job = submit(srv, alice, ["sleep", "1"], request={"count": 3})
    row = srv.wait_state(job, ("COMPLETED",))
    srv.kill(signal.SIGTERM)
    journal = os.path.join(srv.state, "jobs.db")
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = main(["report", "--journal", journal, "--format", "json", "--since", "1h"])
    assert code == 0
    (found,) = json.loads(out.getvalue())
    assert found["name"] == "gw-alice"
    assert found["gpu_hours"] == pytest.approx(3 * row["elapsed"] / 3600, rel=0.05)
    srv.start()  # the journal is untouched: the service starts on it again
    assert srv.job(job)["state"] == "COMPLETED"


ACCOUNTS = """
[service]
require_account = true
[service.accounts]
vision = { members = ["gw-alice", "@gw-lab"] }
nlp = { members = ["gw-bob"], max_time = "1h" }
"""


def test_accounts_charge_jobs_to_their_projects_and_report_them(
    tmp_path: Path, open_dir: Path, monkeypatch: pytest.MonkeyPatch, cli: Any
) -> None:
    conf = open_dir / "config.toml"
    conf.write_text(ACCOUNTS)
    monkeypatch.setenv("GPUWARDEN_SYSTEM_CONFIG", str(conf))
    serve = serving(tmp_path, open_dir, monkeypatch)
    srv = next(serve)
    try:
        alice, bob = make_user("alice", ("lab",)), make_user("bob")
        dave = make_user("dave")
        # Who may charge what: the kernel's uid, never $USER; one line each.
        none = cli_as(srv, dave, "submit", "--", "true")
        assert none.returncode == 2 and "service.require_account" in none.stderr, none.stderr
        theirs = cli_as(srv, alice, "submit", "--account", "nlp", "--", "true")
        assert theirs.returncode == 2, theirs.stderr
        assert "not one of its members (service.accounts nlp members)" in theirs.stderr
        unknown = cli_as(srv, alice, "submit", "--account", "astro", "--", "true")
        assert "no such account here (yours: vision)" in unknown.stderr, unknown.stderr
        untimed = cli_as(srv, bob, "submit", "--account", "nlp", "--", "true")
        assert "(service.accounts nlp max_time)" in untimed.stderr, untimed.stderr

        # Known jobs: alice's own account by default (her only one), bob's named.
        two = cli_as(srv, alice, "submit", "-g", "2", "--", "sleep", "8")
        one = cli_as(
            srv, bob, "submit", "-g", "1", "--account", "nlp", "--time", "10m", "--", "sleep", "3"
        )
        srv.wait_state(int(two.stdout), ("RUNNING",))
        queue = cli_as(srv, bob, "queue")
        assert "ACCOUNT" in queue.stdout and " vision " in queue.stdout, queue.stdout
        ran = cli_as(srv, alice, "run", "-g", "1", "--account", "vision", "--", "sleep", "1")
        assert two.returncode == one.returncode == ran.returncode == 0, (two, one, ran)
        jobs = [int(two.stdout), int(one.stdout)]
        ended = [srv.wait_state(j, ("COMPLETED",), timeout=60) for j in jobs]
        assert [r["account"] for r in ended] == ["vision", "nlp"]
        attached = [r for r in srv.call(None, "jobs")["jobs"] if r["id"] not in jobs]
        assert [r["account"] for r in attached] == ["vision"], attached

        rows = report_csv(srv, dave, "--by", "account")
        vision = 2 * ended[0]["elapsed"] + attached[0]["elapsed"]
        assert float(rows["vision"]["gpu_hours"]) == pytest.approx(vision / 3600, rel=0.05)
        assert float(rows["nlp"]["gpu_hours"]) == pytest.approx(
            ended[1]["elapsed"] / 3600, rel=0.05
        )
        assert rows["vision"]["jobs"] == "2" and rows["nlp"]["jobs"] == "1", rows
        # The web page's usage panel for the month: the same figures (unless the month
        # began while the jobs ran, which splits them: the first two minutes of one).
        if usage_window(time.time())[0] < time.time() - 120:
            page = cli_as(srv, dave, "web", "--once")
            assert page.returncode == 0, page.stderr
            panel = json.loads(page.stdout)["queue"]["usage"]
            shown = {r["name"]: r for r in panel["accounts"]}
            assert shown["vision"]["gpu_hours"] == pytest.approx(vision / 3600, rel=0.05)
            assert shown["vision"]["jobs"] == 2 and shown["nlp"]["jobs"] == 1, panel
            assert {r["name"] for r in panel["users"]} == {"gw-alice", "gw-bob"}, panel
        history = cli_as(srv, alice, "jobs", "--me")
        assert "ACCOUNT" in history.stdout and "vision" in history.stdout, history.stdout
        # The exporter's per-account counters, as Prometheus reads them.
        scraped = cli("exporter", "--once", env={"GPUWARDEN_SOCKET": srv.socket})
        assert scraped.returncode == 0, scraped.stderr
        counted = {
            m.group(1): float(m.group(2))
            for m in re.finditer(
                r'^gpuwarden_account_gpu_seconds_total\{account="([^"]+)",[^}]*\} (\S+)$',
                scraped.stdout,
                re.M,
            )
        }
        assert counted["vision"] == pytest.approx(vision, rel=0.01), counted
        assert counted["nlp"] == pytest.approx(ended[1]["elapsed"], rel=0.01), counted
    finally:
        next(serve, None)


SHARES = """
[service.accounts]
vision = { members = ["gw-alice", "gw-erin"], share = 3, max_gpus = 2 }
nlp = { members = ["gw-bob"], share = 1 }
"""


def test_account_shares_weigh_fair_share_and_max_gpus_caps_an_account(
    tmp_path: Path, open_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    conf = open_dir / "config.toml"
    conf.write_text(SHARES)
    monkeypatch.setenv("GPUWARDEN_SYSTEM_CONFIG", str(conf))
    serve = serving(tmp_path, open_dir, monkeypatch)
    srv = next(serve)
    try:
        alice, bob, erin = make_user("alice", ("lab",)), make_user("bob"), make_user("erin")
        wide = cli_as(srv, alice, "submit", "-g", "3", "--", "true")
        assert wide.returncode == 2, wide
        assert "(service.accounts vision max_gpus)" in wide.stderr, wide.stderr

        # vision's jobs hold 2 GPUs together at most; nlp's start beside them.
        mine = [submit(srv, alice, ["sleep", "30"], request={"count": 1}) for _ in range(3)]
        for job in mine[:2]:
            srv.wait_state(job, ("RUNNING",))
        assert srv.job(mine[2])["reason"] == "AccountGpuLimit", srv.job(mine[2])
        queue = cli_as(srv, bob, "queue")
        assert "AccountGpuLimit" in queue.stdout, queue.stdout
        two = submit(srv, bob, ["sleep", "2"], request={"count": 2})
        assert srv.wait_state(two, ("COMPLETED",), timeout=60)["account"] == "nlp"
        assert srv.job(mine[2])["state"] == "PENDING"

        # Both accounts have used GPUs now: `share` gives each account's usage, share
        # and factor, 2^(-U/S) over the accounts.
        blocker = submit(srv, bob, ["sleep", "30"], request={"count": 2})
        srv.wait_state(blocker, ("RUNNING",))
        waiting = [
            submit(srv, erin, ["true"], request={"count": 1}),
            submit(srv, bob, ["true"], request={"count": 1}),
        ]
        said = cli_as(srv, bob, "share", "--accounts", "--json")
        assert said.returncode == 0, said.stderr
        accounts = {a["account"]: a for a in json.loads(said.stdout)}
        assert {a: accounts[a]["share"] for a in accounts} == {"vision": 3, "nlp": 1}
        used = {a: accounts[a]["usage"] for a in accounts}
        assert used["nlp"] > 0 and used["vision"] == 0, used  # vision's jobs still run
        assert accounts["vision"]["factor"] == 1.0
        assert accounts["nlp"]["factor"] == pytest.approx(2 ** (-1 / 0.25))

        # The queue's priorities carry them: erin (vision, nothing used) against bob,
        # who used all of nlp's; the age term adds at most a point in this time.
        def ranked() -> dict[int, Any]:
            rows = {r["id"]: r for r in srv.call(None, "queue")["jobs"]}
            return rows if all(rows[j]["priority"] is not None for j in waiting) else {}

        shown = wait_for(ranked, 30, "the waiting jobs' priorities")
        weight = 10_000
        assert shown[waiting[0]]["priority"] == pytest.approx(weight * 1.0, abs=1)
        assert shown[waiting[1]]["priority"] == pytest.approx(weight * 2**-4 * 0.5, abs=1)
        text = cli_as(srv, bob, "share")
        assert "ACCOUNT" in text.stdout and "USER" in text.stdout, text.stdout
    finally:
        next(serve, None)


def test_jobs_sharing_a_gpu_each_get_their_own_processes_utilisation(sampled: Server) -> None:
    """Two `--mem` jobs on one GPU, loading it at 60% and 20%: `eff` gives each its
    own processes' share (NVML's per-process utilisation), not the GPU's 80%."""
    srv = sampled
    alice = make_user("alice", ("lab",))
    env = job_env(srv)
    shared = {"count": 1, "mem": 20 << 30, "gpus": ["1"]}
    loads = {
        submit(srv, alice, occupying(60, 12, "10GiB"), request=shared, env=env): 60,
        submit(srv, alice, occupying(20, 12, "10GiB"), request=shared, env=env): 20,
    }
    ended = {j: srv.wait_state(j, ("COMPLETED", "FAILED"), timeout=60) for j in loads}
    assert {r["state"] for r in ended.values()} == {"COMPLETED"}, ended
    assert len({tuple(r["gpus"]) for r in ended.values()}) == 1, ended  # the same GPU
    for job, load in loads.items():
        eff = cli_as(srv, alice, "eff", "--json", str(job))
        assert eff.returncode == 0, eff.stderr
        (row,) = validate("eff", eff.stdout)
        ((use,),) = [r["use"] for r in row["runs"]]
        assert use["level"] == "process" and use["energy"] is None, use
        assert use["mem_peak"] == 10 << 30 and use["mem_total"] == 20 << 30, use
        # its load while it ran; the mean also counts its start (a Python starting)
        assert use["util_seconds"] / use["busy_seconds"] == pytest.approx(load, abs=2), use
        assert use["util_seconds"] / use["seconds"] == pytest.approx(load, abs=0.2 * load), use


def test_a_shared_jobs_memory_peak_comes_from_the_drivers_accounting_where_it_is_on(
    sampled: Server,
) -> None:
    """A `--mem` job whose process holds 12 GiB for a moment, far shorter than a sample,
    then 2 GiB: with the GPU's accounting mode on (root's, as on a real GPU) `eff`
    gives its 12 GiB peak, from the driver's record of that process."""
    from gpuwarden.sim.fake import module
    from servicetools import SPEC

    srv = sampled
    nv = module(SPEC, os.environ["GPUWARDEN_SIM_STATE"])
    nv.nvmlInit()
    nv.nvmlDeviceSetAccountingMode(nv.nvmlDeviceGetHandleByIndex(1), nv.NVML_FEATURE_ENABLED)
    nv.nvmlShutdown()
    alice = make_user("alice", ("lab",))
    for state in Path(os.environ["GPUWARDEN_SIM_STATE"]).iterdir():
        os.chown(state, alice.uid, alice.gid)  # the simulator's state is its one writer's
    brief = (
        "import os, time\n"
        "from gpuwarden.sim import Machine\n"
        "m = Machine.open()\n"
        "m.add_process(1, os.getpid(), '12GiB')\n"
        "time.sleep(0.05)\n"
        "m.add_process(1, os.getpid(), '2GiB')\n"
        "time.sleep(5)\n"
        "m.remove_process(os.getpid())\n"
    )
    shared = {"count": 1, "mem": 20 << 30, "gpus": ["1"]}
    job = submit(srv, alice, ["python3", "-c", brief], request=shared, env=job_env(srv))
    ended = srv.wait_state(job, ("COMPLETED", "FAILED"), timeout=60)
    said = Path(srv.work, f"gpuwarden-{job}.out")
    assert ended["state"] == "COMPLETED", (ended, said.read_text() if said.exists() else "")
    eff = cli_as(srv, alice, "eff", "--json", str(job))
    assert eff.returncode == 0, eff.stderr
    (row,) = validate("eff", eff.stdout)
    ((use,),) = [r["use"] for r in row["runs"]]
    assert use["level"] == "process" and use["seconds"] > 0, use
    assert use["mem_peak"] == 12 << 30 and use["mem_total"] == 20 << 30, use
