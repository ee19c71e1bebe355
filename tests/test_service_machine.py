"""The service's reading of the machine kept current by what decisions need, counted.

On the simulated four A100s: a tick's pass reads again only the GPUs that showed
processes (a GPU freed outside the queue is seen within a tick), not the whole
machine; a GPU a job of the queue left shows none of its processes, read by
nobody; a start that finds a process the reading did not show makes the next pass
read the machine whole; the whole machine at most every `WHOLE_EVERY` seconds."""

from __future__ import annotations

import os
from collections.abc import Callable

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
