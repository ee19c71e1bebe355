"""Inside an enclosing lease (a `gpuwarden run` job), `gpuwarden run` and
`gpuwarden.lease()` take the same decision for the same request: the enclosing GPUs,
or the same refusal; outside one, the same GPUs of the machine."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

import pytest

from repo import SRC

# Asks for the same GPUs twice, through `gpuwarden run` and `gpuwarden.lease()`, and
# prints both answers: [exit status, GPU UUIDs or the error, GPUWARDEN_JOB].
PROBE = """
import json, os, subprocess, sys
import gpuwarden
from gpuwarden.base.errors import UserError
run_args, lease_args = json.loads(sys.argv[1])
show = "import os; print(os.environ['GPUWARDEN_GPUS'], os.environ.get('GPUWARDEN_JOB'))"
r = subprocess.run(
    [sys.executable, "-m", "gpuwarden", "run", *run_args, "--", sys.executable, "-c", show],
    capture_output=True, text=True,
)
ran = [r.returncode, *(r.stdout.split() if r.returncode == 0 else [r.stderr.strip(), None])]
try:
    with gpuwarden.lease(**lease_args) as l:
        leased = [0, ",".join(l.uuids), l.job]
except UserError as err:
    leased = [err.exit_code, str(err), None]
print(json.dumps({"run": ran, "lease": leased, "job": os.environ.get("GPUWARDEN_JOB")}))
"""


def uuid_of(index: int) -> str:
    from gpuwarden.machine.inventory import read_snapshot

    return next(g.uuid for g in read_snapshot().gpus if g.index == index)


def probe(cli: Any, run_args: list[str], lease_args: dict[str, Any], outer: list[str]) -> Any:
    """Both answers, asked inside a `gpuwarden run OUTER` job (`outer` empty: outside)."""
    probe_argv = [sys.executable, "-c", PROBE, json.dumps([run_args, lease_args])]
    if outer:
        r = cli("run", *outer, "--", *probe_argv)
    else:
        env = dict(os.environ, PYTHONPATH=str(SRC))
        r = subprocess.run(probe_argv, env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_lease_inside_a_run_job_gets_the_enclosing_gpu(sim, cli) -> None:
    """The case once refused ("none is free now (GPU 7 leased by ...)"): `lease(1)` inside
    `gpuwarden run -g 1` gets the job's GPU under the job's lease, as a nested `run` does."""
    sim("server-8xa100")
    code = (
        "import os, gpuwarden\n"
        "with gpuwarden.lease(1) as l:\n"
        "    env = os.environ\n"
        "    print(l.uuids[0], l.job, l.fds, env['GPUWARDEN_GPUS'], env['GPUWARDEN_JOB'])\n"
    )
    r = cli("run", "-g", "1", "--", sys.executable, "-c", code)
    assert r.returncode == 0, r.stderr
    got, job, fds, enclosing_gpu, enclosing_job = r.stdout.split()
    assert got == enclosing_gpu and job == enclosing_job and fds == "()"


@pytest.mark.parametrize(
    ("run_args", "lease_args"),
    [
        (["-g", "1"], {"n": 1}),
        (["--gpus", "6"], {"gpus": 6}),
        (["--gpus", "7"], {"gpus": 7}),  # inside `--gpus 6`: the same refusal
    ],
)
def test_run_and_lease_decide_alike_inside_and_outside(
    sim, cli, run_args: list[str], lease_args: dict[str, Any]
) -> None:
    sim("server-8xa100")  # colleagues' jobs on GPUs 0-5: 6 and 7 are free
    outside = probe(cli, run_args, lease_args, outer=[])
    assert outside["job"] is None
    assert outside["run"][0] == outside["lease"][0] == 0
    assert outside["run"][1] == outside["lease"][1]
    assert outside["run"][1] in (uuid_of(6), uuid_of(7))

    inside = probe(cli, run_args, lease_args, outer=["--gpus", "6"])
    assert inside["job"]
    if lease_args.get("gpus") == 7:
        assert inside["run"][0] == inside["lease"][0] != 0
        assert "GPU 7 is not visible here" in inside["lease"][1]
        assert inside["run"][1] == f"gpuwarden run: {inside['lease'][1]}"
    else:
        assert inside["run"][0] == inside["lease"][0] == 0
        assert inside["run"][1] == inside["lease"][1] == uuid_of(6)
        assert inside["run"][2] == inside["lease"][2] == inside["job"]
