"""The queue's plan, as pure functions over its records (the queue service calls them;
the simulator and the benchmarks call the same functions):

- `scheduling`: which waiting jobs start now, and why each other one waits;
- `fairshare`: usage decayed against each user's and account's share;
- `foresight`: when each waiting job is expected to start;
- `preemption`: preemptible jobs on GPUs nobody else can use now;
- `booking`: GPUs booked ahead, kept free by the plan;
- `begintime`, `arrayspec`: `--begin` times and `--array` specs as sbatch reads them.

This file imports nothing, so each module costs only itself.
"""
