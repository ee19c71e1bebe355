"""The seams to the machine: the only modules that ask NVML (or the simulator) and the
kernel what is there.

- `inventory`: a frozen `Snapshot` of the GPUs, read once;
- `gpuprocesses`: who holds a context on a GPU, owners from the kernel;
- `topology`: PCIe levels and NVLink counts between GPUs;
- `nvmlload`: nvidia-ml-py's module without what it imports and never uses;
- `processuse`: each process's use of a shared GPU, for the efficiency sampler;
- `ancestry`: a process's ancestry, which ties a GPU process to its lease.

This file imports nothing, so each module costs only itself.
"""
