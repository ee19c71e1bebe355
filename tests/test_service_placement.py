"""The queue service places jobs with `run`'s choice: the GPUs `run --dry-run` names.

The real service (tests/servicetools.py) on two simulated machines: four idle A100s in two
NVLink pairs, 0+2 and 1+3, across PCIe switches 0+1 and 2+3 (tests/data/pairs-4xa100.toml),
where a 2-GPU job belongs on an NVLink pair and a 1-GPU job not on GPU 0; and `mixed`,
whose A100 is split into MIG slices. The scheduler decides who starts and how many GPUs;
which GPUs is gpuwarden.placement.selection's.
"""

from __future__ import annotations

import copy
import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from repo import SRC
from servicetools import SPEC, Server, cli_as, serving
from users import make_user

PAIRS = str(Path(SPEC).with_name("pairs-4xa100.toml"))


@pytest.fixture
def pairs(tmp_path: Path, open_dir: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Server]:
    yield from serving(tmp_path, open_dir, monkeypatch, spec=PAIRS)


@pytest.fixture
def mixed(tmp_path: Path, open_dir: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Server]:
    yield from serving(tmp_path, open_dir, monkeypatch, spec="mixed")


def dry_run(spec: str, *args: str) -> str:
    """What `run --dry-run` would set CUDA_VISIBLE_DEVICES to on `spec`, without a service."""
    env = dict(os.environ, PYTHONPATH=str(SRC), GPUWARDEN_SIM=spec, GPUWARDEN_SOCKET="/nonexistent")
    out = subprocess.run(
        [sys.executable, "-m", "gpuwarden", "run", "--dry-run", "--uuid", *args, "--", "true"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    found = re.search(r"CUDA_VISIBLE_DEVICES=(\S+)", out.stdout)
    assert found, out.stdout
    return found.group(1)


def placed(srv: Server, *args: str) -> str:
    """Submit `sleep` as a real user with `args`; the GPUs it got once running, in order."""
    alice = make_user("alice", ("lab",))
    sub = cli_as(srv, alice, "submit", *args, "--", "sleep", "60")
    assert sub.returncode == 0, sub.stderr
    job = int(sub.stdout.strip())
    row = srv.wait_state(job, ("RUNNING", "FAILED"))
    assert row["state"] == "RUNNING", row
    got = ",".join(row["gpus"])
    assert cli_as(srv, alice, "cancel", str(job)).returncode == 0
    assert srv.wait_state(job, ("CANCELLED",))["signal"] == signal.SIGTERM
    return got


def test_the_simulated_pairs_are_joined_by_nvlink(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from gpuwarden.base.errors import UserError
    from gpuwarden.machine.inventory import read_snapshot
    from gpuwarden.sim import specs

    monkeypatch.setenv("GPUWARDEN_SIM", PAIRS)
    assert read_snapshot(topology=True).nvlinks == {(0, 2): 12, (1, 3): 12}
    one_sided = tmp_path / "one-sided.toml"
    one_sided.write_text('[[gpu]]\nmodel = "T4"\nnvlink_peer = 1\n[[gpu]]\nmodel = "T4"\n')
    with pytest.raises(UserError, match="nvlink_peer"):
        specs.load(str(one_sided))
    bridged = tmp_path / "bridged.toml"
    bridged.write_text(
        '[[gpu]]\nmodel = "A100-SXM4-80GB"\nnvlink_peer = 1\n[[gpu]]\nmodel = "A100-SXM4-80GB"\n'
    )
    with pytest.raises(UserError, match="must name GPU 0 as its nvlink_peer"):
        specs.load(str(bridged))


def test_service_jobs_get_the_gpus_run_would_choose_by_topology(pairs: Server) -> None:
    two = dry_run(PAIRS, "-g", "2")
    one = dry_run(PAIRS, "-g", "1")
    assert len(two.split(",")) == 2
    assert placed(pairs, "-g", "2") == two  # an NVLink pair, not GPUs 0 and 1 in order
    assert placed(pairs, "-g", "1") == one  # GPU 0 is kept for last, as `run` keeps it


def test_service_jobs_on_mig_slices_get_what_run_would_choose(mixed: Server) -> None:
    slice_1g = dry_run("mixed", "--mig", "1g.10gb")
    assert slice_1g.startswith("MIG-")
    assert placed(mixed, "--mig", "1g.10gb") == slice_1g  # the free one: heidi is on the other
    assert placed(mixed, "-g", "1") == dry_run("mixed", "-g", "1")  # the free 2g.20gb


def test_a_pass_plans_by_the_reading_it_is_handed(
    sim, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The service reads the configuration once a pass and hands the reading down: the
    plan's drains and health, the leases a start takes, the health a submit is judged
    by. Nothing below reads it again (issue 25), so here the directories of the reading
    count, not those of the variables. The lease directory is the service's from its
    start (settings.from_config): a running service keeps it."""
    from gpuwarden import config
    from gpuwarden.health import drain
    from gpuwarden.jobs import allocation
    from gpuwarden.leases.dir import open_dir as lease_dir
    from gpuwarden.machine.inventory import read_snapshot
    from gpuwarden.placement.request import Request
    from gpuwarden.service import admission, placing, store
    from gpuwarden.service.settings import from_config

    sim("server-8xa100")
    snapshot = read_snapshot(processes=True)
    six, seven = snapshot.gpus[6].uuid, snapshot.gpus[7].uuid
    leases_here, state_here = tmp_path / "its-leases", tmp_path / "its-state"
    drain.drain(seven, "in the reading's state directory", directory=state_here)
    reading = config.load({"lease.dir": str(leases_here), "state.dir": str(state_here)})
    settings = from_config(reading, {"socket": str(tmp_path / "s.sock"), "state_dir": "x"})
    assert settings.lease_dir == str(leases_here)

    def reading_again(*_: object, **__: object) -> None:
        raise AssertionError("the configuration was read again below the pass")

    monkeypatch.setattr(config, "load", reading_again)
    job = store.Job(
        1, os.getuid(), os.getgid(), "me", ("true",), "/", {}, 0o22, {"count": 1}, "PENDING", 0.0
    )
    gpus, *_ = placing.inputs(snapshot, [], [job], settings, reading)
    usable = {g.uuid: g.usable for g in gpus}
    assert (usable[six], usable[seven]) == (True, False)
    assert "only 8" in str(admission.never_runs(snapshot, Request(count=9), reading))
    assert admission.never_runs(snapshot, Request(count=1), reading) is None
    # A submit's answer is judged once for the machine and reading in force.
    judged = admission.Judged()
    for _ in range(3):
        assert "only 8" in str(judged.never_runs(snapshot, Request(count=9), reading))
        assert judged.never_runs(snapshot, Request(count=1), reading) is None
    assert judged.judged == 2
    judged.never_runs(snapshot, Request(count=1), copy.copy(reading))  # another reading
    assert judged.judged == 3
    ld = lease_dir(settings.lease_dir)
    taken = allocation.attempt(ld, Request(count=1, gpus=(seven,)), snapshot, conf=reading)
    assert taken.held is None and "drained" in (taken.choice.error or "")
    taken = allocation.attempt(ld, Request(count=1, gpus=(six,)), snapshot, conf=reading)
    assert taken.held is not None
    taken.held.release()
    assert (leases_here / f"{six}.lock").exists()
