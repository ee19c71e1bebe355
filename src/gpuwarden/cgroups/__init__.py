"""A job's own cgroups: the GPUs it may open, and what it uses (machine layer).

- `hierarchy`: where this process's cgroups are mounted and which device isolation
  this machine can give a job (`judge`, pure, and `detect`);
- `devices`: the job's cgroup that opens only its leased GPUs' device nodes: making
  and joining it, the cgroup v1 `devices.deny` rules, and what `gpuwarden run` calls;
- `bpf`: the cgroup v2 way, a BPF device program assembled by hand;
- `migcaps`: which `/dev/nvidia-caps` node opens which MIG slice, so that a job on one
  slice cannot open another;
- `accounting`: the job's processes, CPU and memory read from the same cgroups, and a
  signal that reaches all of them.

This file imports nothing: `gpuwarden run` loads `devices` and `hierarchy` alone, and
`migcaps` and `bpf` only on a machine that needs them.
"""
