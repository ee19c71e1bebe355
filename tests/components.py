"""Outside components a test needs (useradd, podman, Slurm, torch, ...): skip where one
is missing, fail where CI says every test must run.

A skip names what is missing and how to get it, so a developer's run says what it did
not cover; under CI (GPUWARDEN_REQUIRE_COMPONENTS=1) the same test fails instead, so a
component dropped from the CI image cannot turn a test into a silent skip.
"""

from __future__ import annotations

import importlib.util
import os

import pytest


def require(available: bool, why: str, module: bool = False) -> None:
    """Skip a test (or with `module`, a whole test module) whose outside component is
    missing here, with the reason; fail it where GPUWARDEN_REQUIRE_COMPONENTS=1 (CI),
    which must run every test."""
    if available:
        return
    if os.environ.get("GPUWARDEN_REQUIRE_COMPONENTS") == "1":
        pytest.fail(f"{why}, and GPUWARDEN_REQUIRE_COMPONENTS=1", pytrace=False)
    pytest.skip(why, allow_module_level=module)


TORCH_MISSING = "torch is not installed (scripts/test installs torch==2.13.0)"


def torch_found() -> bool:
    """Whether torch can be imported here, found without importing it (seconds)."""
    return importlib.util.find_spec("torch") is not None
