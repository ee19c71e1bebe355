"""What the tests with a real podman share: the image, whether it is here, the probe."""

from __future__ import annotations

import os
import shutil
import subprocess

IMAGE = "localhost/gw-busybox:1"  # scripts/containers-ci builds it

# Run in a container: which /dev/nvidia* nodes it has and may open (a node it may open
# reads "No such device or address": no driver behind it), its CUDA_VISIBLE_DEVICES.
PROBE = (
    "for n in 0 1 2 3 4 5 6 7; do [ -e /dev/nvidia$n ] && echo nvidia$n "
    '$(cat /dev/nvidia$n 2>&1 | grep -o "No such device or address"); done; '
    "echo CVD=$CUDA_VISIBLE_DEVICES; exit 7"
)


def podman_ready() -> bool:
    """podman runs here as root and has IMAGE."""
    if shutil.which("podman") is None or os.geteuid() != 0:
        return False
    found = subprocess.run(["podman", "image", "exists", IMAGE], capture_output=True)
    return found.returncode == 0
