"""What sampling running jobs' GPUs for `gpuwarden eff` costs the service, at 8 GPUs.

    .venv/bin/python bench/sampler.py [--steps 200] [--every 10]

Eight one-GPU jobs run on the simulated 8x A100 server; the service's sampler
(service.sampler) takes `--steps` samples of them, each one NVML reading of the
machine (power and energy included) and the additions into the runs' summaries.
Printed: CPU time per sample, of which the NVML reading, and the share of one core
at one sample every `--every` seconds (the target: at most 1%), beside the same
reading without the sampler's work (the peer here: the reading the enforcement
watcher already makes). With `--shared` the jobs are `--mem` jobs, so each sample
also reads NVML's per-process utilisation of their GPUs and their accounting mode
(the memory peaks where it is on). On real GPUs the reading
costs what the driver takes.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))
os.environ["GPUWARDEN_SIM"] = "server-8xa100"
os.environ.setdefault("GPUWARDEN_SIM_STATE", tempfile.mkdtemp(prefix="gpuwarden-bench-"))

from gpuwarden.machine.gpuprocesses import read_memory_peaks, read_process_use
from gpuwarden.machine.inventory import load_nvml, read_snapshot
from gpuwarden.service import store as st
from gpuwarden.service.sampler import Sampler


def cpu(call, steps: int) -> float:  # type: ignore[no-untyped-def]
    start = time.process_time()
    for _ in range(steps):
        call()
    return (time.process_time() - start) / steps


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--every", type=float, default=10.0)
    parser.add_argument("--shared", action="store_true", help="--mem jobs: per-process reads")
    args = parser.parse_args()
    uuids = [g.uuid for g in read_snapshot().gpus]
    with tempfile.TemporaryDirectory() as tmp:
        journal = st.Store(os.path.join(tmp, "jobs.db"))
        now = time.time()
        jobs = []
        for uuid in uuids:
            job = journal.add(
                st.new_job(
                    uid=1000,
                    gid=1000,
                    user="alice",
                    argv=("x",),
                    cwd="/",
                    env={},
                    umask=18,
                    request={"count": 1},
                )
            )
            journal.update(job.id, state=st.STARTING, gpus=(uuid,))
            journal.update(job.id, state=st.RUNNING, started=now - 60)
            got = journal.get(job.id)
            assert got is not None
            jobs.append(dataclasses.replace(got, mem=20 << 30) if args.shared else got)
        nvml = load_nvml()

        def process_use(uuids: list[str], since: int) -> Any:
            nvml.nvmlInit()
            try:
                return read_process_use(nvml, uuids, since)
            finally:
                nvml.nvmlShutdown()

        def memory_peaks(pids: dict[str, set[int]]) -> Any:
            nvml.nvmlInit()
            try:
                return read_memory_peaks(nvml, pids)
            finally:
                nvml.nvmlShutdown()

        sampler = Sampler(args.every, read_snapshot, process_use, memory_peaks)
        clock = [now]

        def sample() -> None:
            clock[0] += args.every
            sampler.step(journal, jobs, clock[0], lambda job: set())

        reading = cpu(read_snapshot, args.steps)
        step = cpu(sample, args.steps)
        journal.close()
    print(f"GPUs: {len(uuids)}, samples: {args.steps}, shared jobs: {args.shared}")
    print(f"the NVML reading alone      {reading * 1000:8.2f} ms CPU")
    print(
        f"one sample (reading + sums) {step * 1000:8.2f} ms CPU   "
        f"{step / reading:4.2f}x the reading"
    )
    print(f"share of a core, one sample every {args.every:g} s: {100 * step / args.every:.3f}%")
    return 0


if __name__ == "__main__":
    sys.exit(main())
