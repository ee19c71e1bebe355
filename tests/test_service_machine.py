"""The service's reading of the machine kept current by what decisions need, counted.

On the simulated four A100s: a tick's pass reads again only the GPUs that showed
processes (a GPU freed outside the queue is seen within a tick), not the whole
machine; a GPU a job of the queue left shows none of its processes, read by
nobody; a start that finds a process the reading did not show makes the next pass
read the machine whole; the whole machine at most every `WHOLE_EVERY` seconds."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from gpuwarden.service.machine import WHOLE_EVERY, Machine
from gpuwarden.sim import Machine as Sim

TICK = 1.0


def test_a_pass_reads_what_may_have_changed_not_the_whole_machine(
    sim: Callable[[str], str],
) -> None:
    sim(os.path.join(os.path.dirname(__file__), "data", "idle-4xa100.toml"))
    board = Sim.open()
    clock = [0.0]
    machine = Machine(clock=lambda: clock[0])
    first = machine.current(TICK)
    assert machine.whole_reads == 1 and len(first.gpus) == 4
    one, two = first.gpus[0], first.gpus[1]
    outside, ours = os.getpid(), os.getppid()  # live processes: the simulator keeps those

    # Idle: a tick later nothing shows processes, so nothing is read.
    calls = machine.calls
    clock[0] += TICK
    machine.current(TICK)
    assert (machine.whole_reads, machine.calls) == (1, calls)

    # A process outside the queue on GPU 0, seen when a start chooses it: the
    # reading was behind, so the next pass reads the whole machine.
    board.add_process(0, outside, "1GiB", user="eve")
    seen = machine.chosen([one.uuid])
    assert [p.pid for p in seen.gpus[0].processes] == [outside]
    machine.current(TICK)
    assert machine.whole_reads == 2

    # Its end is seen within a tick, by reading that GPU alone (a few calls).
    board.remove_process(outside)
    calls = machine.calls
    clock[0] += TICK
    after = machine.current(TICK)
    assert not after.gpus[0].processes
    assert machine.whole_reads == 2 and 0 < machine.calls - calls <= 8

    # A job of the queue on GPU 1 (its processes read by the tick) ends: they leave
    # the reading with it, and nothing is read for that.
    board.add_process(1, ours, "1GiB", user="alice")
    machine.chosen([two.uuid])
    board.remove_process(ours)
    calls = machine.calls
    machine.freed([two.uuid])
    assert not machine.snapshot.gpus[1].processes and machine.calls == calls
    assert machine.chosen([two.uuid]) and machine.whole_reads == 2  # nothing new: not behind

    clock[0] += WHOLE_EVERY
    machine.current(TICK)
    assert machine.whole_reads == 3


def test_the_gpu_nodes_are_listed_again_only_when_dev_changes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A start's device cgroup denies every GPU node but the job's: /dev is listed for
    them once, and again when a node comes or goes (its stat changes), not per start."""
    from gpuwarden.cgroups import devices
    from gpuwarden.service import machine as kept

    dev = tmp_path / "dev"
    dev.mkdir()
    listed: list[str] = []
    real = devices.present_minors
    monkeypatch.setattr(kept, "DEV", str(dev))
    monkeypatch.setattr(kept, "SETTLED", 0.05)
    monkeypatch.setattr(devices, "present_minors", lambda g, d: listed.append(d) or real(g, d))
    time.sleep(0.1)  # settled
    gpus = [SimpleNamespace(minor=1), SimpleNamespace(minor=None)]
    machine = Machine()
    for _ in range(5):
        assert machine.present(gpus) == (1,)
    assert len(listed) == 1
    (dev / "nvidia-new").touch()  # a node came (not a GPU's: its name says so)
    assert machine.present(gpus) == (1,)
    assert len(listed) == 2
    time.sleep(0.1)
    machine.present(gpus)
    machine.present(gpus)
    assert len(listed) == 3  # listed while fresh, then kept


class Depth:
    """An NVML module that says how often it was initialised from nothing (a real
    driver's costly nvmlInit), not only how often nvmlInit was called."""

    def __init__(self, nvml: Any) -> None:
        self._nvml = nvml
        self.depth = 0
        self.fresh = 0

    def nvmlInit(self) -> None:
        self._nvml.nvmlInit()
        self.fresh += self.depth == 0
        self.depth += 1

    def nvmlShutdown(self) -> None:
        self._nvml.nvmlShutdown()
        self.depth -= 1

    def __getattr__(self, name: str) -> Any:
        return getattr(self._nvml, name)


def test_nvml_is_initialised_once_a_minute_not_per_start(sim: Callable[[str], str]) -> None:
    from gpuwarden.machine.inventory import load_nvml
    from gpuwarden.service.machine import WHOLE_EVERY as MINUTE

    sim(os.path.join(os.path.dirname(__file__), "data", "idle-4xa100.toml"))
    nvml = Depth(load_nvml())
    clock = [0.0]
    machine = Machine(nvml=lambda: nvml, clock=lambda: clock[0])
    uuids = [g.uuid for g in machine.read().gpus]
    assert nvml.fresh == 1 and nvml.depth == 0
    for n in range(20):  # starts, and the watch's whole readings between them
        machine.chosen([uuids[n % 4]])
        if n % 5 == 0:
            machine.read()
        clock[0] += 1.0
    assert nvml.fresh == 2 and nvml.depth == 1  # one session, the readings inside it
    clock[0] += MINUTE
    machine.read()  # a minute on: initialised afresh (a reset GPU is seen)
    machine.chosen([uuids[0]])
    assert nvml.fresh == 4 and nvml.depth == 1
    machine.close()
    assert nvml.depth == 0
