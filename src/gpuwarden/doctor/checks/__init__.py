"""The doctor's checks: pure functions `Facts -> list[Finding]`, run in this order."""

from __future__ import annotations

from collections.abc import Callable

from gpuwarden.doctor.checks.containers import check_containers
from gpuwarden.doctor.checks.distributed import check_distributed
from gpuwarden.doctor.checks.driver import check_driver, check_driver_toolkit
from gpuwarden.doctor.checks.enforcement import check_enforcement
from gpuwarden.doctor.checks.in_process import check_in_process
from gpuwarden.doctor.checks.kernels import check_kernels
from gpuwarden.doctor.checks.machine import check_machine
from gpuwarden.doctor.checks.service import check_service
from gpuwarden.doctor.checks.torch_build import check_torch_build
from gpuwarden.doctor.checks.visible import check_visible
from gpuwarden.doctor.facts import Facts
from gpuwarden.doctor.findings import Finding

CHECKS: tuple[Callable[[Facts], list[Finding]], ...] = (
    check_driver,
    check_torch_build,
    check_driver_toolkit,
    check_kernels,
    check_visible,
    check_distributed,
    check_machine,
    check_enforcement,
    check_containers,
    check_service,
    check_in_process,
)


def run_checks(facts: Facts) -> list[Finding]:
    found: list[Finding] = []
    for check in CHECKS:
        found.extend(check(facts))
    return found
