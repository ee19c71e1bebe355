"""`import py3nvml` in a shell set up by `gpuwarden sim env`.

py3nvml carries its own copy of old NVML bindings, which load libnvidia-ml.so.1
themselves, so the `pynvml` shim beside this package does not reach it. This package
becomes the installed py3nvml (every module of it is loaded from there); with
GPUWARDEN_SIM set, its bindings (`py3nvml.py3nvml`) get the simulated library instead
of the driver's. Without GPUWARDEN_SIM it is the installed package unchanged.
"""

from gpuwarden.sim.otherbindings import stand_in as _stand_in

_stand_in(globals())
