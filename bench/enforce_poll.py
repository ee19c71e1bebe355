"""What `gpuwarden enforce --watch` costs per poll: CPU time of one reading (NVML,
leases, policies) on a simulated 8-GPU server with 64 GPU processes.

    .venv/bin/python bench/enforce_poll.py [--polls 50]

Target: < 1% of a core at one poll a second, i.e. < 10 ms of CPU per poll. The
simulated processes are not processes here, so their ancestry costs one failed
/proc lookup each; on a real server add one /proc read per ancestor.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))


def spec_text(gpus: int = 8, per_gpu: int = 8) -> str:
    text = ""
    for _ in range(gpus):
        text += '[[gpu]]\nmodel = "A100-SXM4-80GB"\nutilization = 50\n'
        for p in range(per_gpu):
            text += f'[[gpu.process]]\nuser = "u{p}"\ncommand = "python train.py"\n'
            text += 'memory = "1GiB"\n'
    return text


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--polls", type=int, default=50)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        spec = Path(tmp) / "busy64.toml"
        spec.write_text(spec_text())
        os.environ.update(
            GPUWARDEN_SIM=str(spec),
            GPUWARDEN_SIM_STATE=os.path.join(tmp, "sim"),
            GPUWARDEN_LEASE_DIR=os.path.join(tmp, "leases"),
            GPUWARDEN_STATE_DIR=os.path.join(tmp, "state"),
        )
        from gpuwarden.leases import list_leases
        from gpuwarden.machine.inventory import read_snapshot
        from gpuwarden.monitoring.enforcer import Enforcer
        from gpuwarden.usage.enforcement import EnforceSettings

        logging.disable(logging.CRITICAL)  # 64 "unleased" lines a poll are not the cost
        count = sum(len(g.processes) for g in read_snapshot().gpus)
        enforcer = Enforcer(EnforceSettings())
        cpu0, wall0 = time.process_time(), time.perf_counter()
        for _ in range(args.polls):
            now = time.time()
            enforcer.carry_out(enforcer.step(read_snapshot(), list_leases(), now), now)
        cpu = (time.process_time() - cpu0) / args.polls
        wall = (time.perf_counter() - wall0) / args.polls
    share = cpu * 100  # percent of a core at one poll a second
    print(f"{args.polls} polls, {count} GPU processes on 8 simulated GPUs")
    print(f"per poll: {cpu * 1000:.2f} ms CPU, {wall * 1000:.2f} ms wall")
    print(
        f"at one poll a second: {share:.2f}% of a core (target < 1%): "
        + ("met" if share < 1 else "NOT met")
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
