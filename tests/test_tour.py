"""The README's first command ends in `scripts/tour.py`: run the tour as a user would.

Nothing else exercises it end to end, and it is the first thing a new lab member
runs: a module moved under it once made it stop halfway (its drain count named the
old path) and no test noticed. As root it also starts the queue service on its own
socket, so this covers the shared-queue part too.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.slow
def test_the_tour_runs_every_step_on_the_simulated_server() -> None:
    done = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "tour.py")],
        capture_output=True,
        text=True,
        timeout=300,
        env=os.environ.copy(),  # the suite's own: no real leases, state or system file
    )
    out = done.stdout
    tail = f"{out[-3000:]}\n{done.stderr[-3000:]}"
    assert done.returncode == 0, f"tour exited {done.returncode}:\n{tail}"
    # Each part reached its end, in order: two jobs on different GPUs, the waiting job
    # admitted, the automatic drain after the XID, and the closing hint.
    steps = [
        "[job A] started on CUDA_VISIBLE_DEVICES=",
        "[job B] started on CUDA_VISIBLE_DEVICES=",
        "[job C] started on CUDA_VISIBLE_DEVICES=",
        "all three jobs finished",
        "$ gpuwarden sim inject xid 79 --gpu 7",
        "Afterwards: drains with their reasons",
        "Done. Try it yourself in a new shell:",
    ]
    at = [out.find(step) for step in steps]
    assert all(i >= 0 for i in at), dict(zip(steps, at))
    assert at[3] < at[4] < at[5] < at[6]
    given = dict(re.findall(r"^  \[job ([AB])\] started on CUDA_VISIBLE_DEVICES=(\S+)", out, re.M))
    assert set(given) == {"A", "B"}, out  # the jobs' own lines, not the commands echoed
    assert given["A"] != given["B"], "two jobs started at once were given the same GPU"
    if os.geteuid() == 0:  # the queue part: three submits, backfill, history and logs
        assert "$ gpuwarden submit -g 2" in out
        assert "two GPUs:" in out  # job 2's own output, shown by `gpuwarden logs 2`
        assert "job 2 needs two GPUs" in out
