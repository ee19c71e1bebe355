"""`import pynvml` for any NVML client in a shell set up by `gpuwarden sim env`.

With GPUWARDEN_SIM set, this module replaces itself in sys.modules by gpuwarden's
fake (nvidia-ml-py's own code over a simulated library); without it, by the real
nvidia-ml-py module, so leaving the directory on PYTHONPATH is harmless.
"""

import os
import sys

if os.environ.get("GPUWARDEN_SIM"):
    from gpuwarden.sim.fake import module as _fake

    sys.modules[__name__] = _fake()
else:
    from gpuwarden.sim.fake import load_copy as _load_copy

    _load_copy(__name__)
