"""`gpuwarden.lease(...)` and `gpuwarden.select(...)` on the simulated server."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

import gpuwarden
import gpuwarden.leases as leases
from gpuwarden.base.errors import UserError


def test_lease_yields_gpus_and_env_and_sets_nothing_globally(sim) -> None:
    sim("server-8xa100")
    before = dict(os.environ)
    with gpuwarden.lease(n=1, min_free="20GiB") as gpus:
        assert len(gpus) == 1
        [gpu] = gpus
        assert gpus.env["CUDA_VISIBLE_DEVICES"] == str(gpu.index) == gpus.visible
        assert gpus.vars["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
        assert gpus.env["GPUWARDEN_JOB"] == gpus.job
        assert [i.uuid for i in leases.list_leases()] == [gpu.uuid]
        out = subprocess.run(
            [sys.executable, "-c", "import os; print(os.environ['CUDA_VISIBLE_DEVICES'])"],
            env=gpus.env,
            capture_output=True,
            text=True,
            check=True,
        )
        assert out.stdout.strip() == gpus.visible
        # a second lease gets the other free GPU (6 and 7 are the free ones)
        with gpuwarden.lease(1) as other:
            assert other.uuids != gpus.uuids
            with pytest.raises(UserError) as err, gpuwarden.lease(1):
                pass
            assert err.value.exit_code == 75
    assert dict(os.environ) == before
    assert leases.list_leases() == []


def test_select_reserves_nothing(sim) -> None:
    sim("server-8xa100")
    picked = gpuwarden.select(2)
    assert [g.index for g in picked] == [6, 7]
    assert leases.list_leases() == []
    with gpuwarden.lease(gpus=[7]):
        assert [g.index for g in gpuwarden.select(1)] == [6]


def test_api_bad_input(sim) -> None:
    sim("server-8xa100")
    with pytest.raises(UserError, match="invalid n"):
        gpuwarden.select(0)
    with pytest.raises(UserError, match="min_free"):
        gpuwarden.select(1, min_free="10XB")
    with pytest.raises(UserError, match="only 8 GPUs"), gpuwarden.lease(9, wait=True):
        pass
    with pytest.raises(UserError, match="unknown GPU"):
        gpuwarden.select(gpus="42")


def test_shared_api_lease(sim) -> None:
    sim("server-8xa100")
    with gpuwarden.lease(gpus=7, mem="10GiB") as a, gpuwarden.lease(gpus=7, mem="10GiB") as b:
        assert a.uuids == b.uuids
        assert a.env["GPUWARDEN_MEM_LIMIT"] == str(10 * 2**30)
        assert sorted(i.mem for i in leases.list_leases()) == [10 * 2**30] * 2


def test_api_names_survive_importing_every_module() -> None:
    import gpuwarden.jobs.api
    import gpuwarden.leases
    import gpuwarden.placement.selection

    assert gpuwarden.lease is gpuwarden.jobs.api.hold
    assert gpuwarden.select is gpuwarden.jobs.api.pick


def test_lease_and_select_read_the_configuration_once(sim, monkeypatch) -> None:
    """One `gpuwarden.lease()` (or `select()`) reads the configuration once, at its
    entry with its arguments, and hands that reading down: the service's socket, the
    lease directory, the drains and XID logs, the health rules (as `run` does)."""
    from gpuwarden import config

    sim("server-8xa100")
    real, reads = config.load, []

    def counted(*args: object, **kwargs: object) -> config.Config:
        reads.append(args)
        return real(*args, **kwargs)

    monkeypatch.setattr(config, "load", counted)
    with gpuwarden.lease(n=1, min_free="20GiB") as gpus:
        assert len(reads) == 1 and len(gpus) == 1
    assert len(reads) == 1 and leases.list_leases() == []
    reads.clear()
    assert [g.index for g in gpuwarden.select(2)] == [6, 7]
    assert len(reads) == 1
