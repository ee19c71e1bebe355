"""Jobs: from a request to a running job and back, one module per part:

- `path`: the one path from a request to a running job, every decision on it made
  once (`start`: the CPU, the queue service, an enclosing lease or this process
  leasing; the device cgroup, DDP ranks, containers) and the steps `gpuwarden
  reserve`, `gpuwarden.lease()` and the kernel provisioner share with it;
- `allocation`: choosing GPUs and taking their leases under the allocation lock,
  serving earlier waiters first; waiting in line until granted or out of time;
- `launch`: starting the job: its environment, process group, signals, exit status;
- `holder`: a lease kept by a detached holder process (`reserve`, a Slurm job);
- `output`: a job's output file, read safely once or followed until the job ends.

This file imports nothing, so `gpuwarden logs` loads only `output`, and `run`
through a queue service nothing of choosing or leasing.
"""
