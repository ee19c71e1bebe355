"""Every face takes the same decision for the same request: `gpuwarden run`,
`gpuwarden.lease()`, a Jupyter kernel (jupyter_client's KernelManager), `gpuwarden
reserve` and the submitit executor, asked for "a GPU" (the default request) on the
CPU-only laptop, with a queue service, inside an enclosing lease (a `gpuwarden run -g 1`
job, the nested `lease()` case) and on a plain machine.

A probe process asks every face in turn. `jobs.holding.decide` is wrapped there to
note what it decided and stop the face right after (nothing is taken): the decision
is what is compared, and it must be one of the four, and the same for every face.
Each face's own end of each decision is tested where the face is (tests/test_run.py,
test_api.py, test_notebooks.py, test_reserve.py, test_submitit.py, test_nested.py).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from repo import SRC

PROBE = r"""
import json, sys
from gpuwarden.jobs import holding

class Decided(Exception):
    pass

real = holding.decide

def noted(request, conf, face):
    got = real(request, conf, face)
    raise Decided("here" if isinstance(got, holding.MachineReader) else got.kind)

holding.decide = noted

def ask(face):
    try:
        face()
    except Decided as d:
        return str(d)
    except SystemExit as e:
        return f"exit {e.code}"
    except Exception as e:
        return f"{type(e).__name__}: {e}"
    return "no decision"

def run():
    from gpuwarden.cli import main
    main(["run", "--", "true"])

def reserve():
    from gpuwarden.cli import main
    main(["reserve"])

def lease():
    import gpuwarden
    with gpuwarden.lease():
        pass

def kernel():
    from jupyter_client import KernelManager
    km = KernelManager(kernel_name="gpuwarden-1gpu")
    try:
        km.start_kernel()
    finally:
        if km.has_kernel:
            km.shutdown_kernel(now=True)

def submitit():
    from gpuwarden.submitit import GpuwardenExecutor
    raise Decided("service" if GpuwardenExecutor.affinity() > 0 else "not the service")

faces = {"run": run, "lease": lease, "kernel": kernel, "reserve": reserve}
if "--submitit" in sys.argv:
    faces["submitit"] = submitit
print(json.dumps({name: ask(face) for name, face in faces.items()}))
"""


def _have(*modules: str) -> bool:
    import importlib.util

    return all(importlib.util.find_spec(m) for m in modules)


@pytest.fixture
def kernelspec(tmp_path: Path, cli, monkeypatch: pytest.MonkeyPatch) -> None:
    from components import require

    require(_have("jupyter_client", "ipykernel"), "jupyter_client and ipykernel (test group)")
    monkeypatch.setenv("JUPYTER_DATA_DIR", str(tmp_path / "jupyter"))
    monkeypatch.setenv("JUPYTER_RUNTIME_DIR", str(tmp_path / "runtime"))
    monkeypatch.setenv("JUPYTER_PLATFORM_DIRS", "1")
    done = cli("kernel", "install")  # "a GPU": the default request, as the other faces
    assert done.returncode == 0, done.stderr


@pytest.fixture
def service_socket(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """A socket where the configuration says the service is (nothing is asked of it:
    the decision is taken before)."""
    path = tmp_path / "service.sock"
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(path))
    sock.listen()
    monkeypatch.setenv("GPUWARDEN_SOCKET", str(path))
    try:
        yield
    finally:
        sock.close()


def _decisions(cli, inside: list[str] | None = None, submitit: bool = False) -> dict[str, Any]:
    argv = [sys.executable, "-c", PROBE, *(["--submitit"] if submitit else [])]
    if inside is not None:
        r = cli("run", *inside, "--", *argv)
    else:
        env = dict(os.environ, PYTHONPATH=str(SRC))
        r = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    return dict(json.loads(r.stdout.strip().splitlines()[-1]))


def _submitit() -> bool:
    return _have("submitit")


def test_on_a_laptop_without_a_driver_every_face_runs_on_the_cpu(sim, cli, kernelspec) -> None:
    sim("laptop-none")
    got = _decisions(cli, submitit=_submitit())
    assert got.pop("submitit", "not the service") == "not the service"
    assert got == dict.fromkeys(("run", "lease", "kernel", "reserve"), "cpu")


def test_with_a_queue_service_every_face_holds_through_it(
    sim, cli, kernelspec, service_socket
) -> None:
    sim("server-8xa100")
    got = _decisions(cli, submitit=_submitit())
    assert got == dict.fromkeys(("run", "lease", "kernel", "reserve", "submitit"), "service")


def test_inside_a_run_job_every_face_takes_the_enclosing_lease(sim, cli, kernelspec) -> None:
    """The nested case: inside `gpuwarden run -g 1`, `gpuwarden.lease()` decides as a
    nested `gpuwarden run` does (once refused: "none is free now (GPU 7 leased by ...)")."""
    sim("server-8xa100")
    got = _decisions(cli, inside=["-g", "1"])
    assert got == dict.fromkeys(("run", "lease", "kernel", "reserve"), "enclosing")


def test_on_a_plain_machine_every_face_leases_here(sim, cli, kernelspec) -> None:
    sim("server-8xa100")
    got = _decisions(cli, submitit=_submitit())
    assert got.pop("submitit", "not the service") == "not the service"
    assert got == dict.fromkeys(("run", "lease", "kernel", "reserve"), "here")


def test_lease_on_a_laptop_runs_its_block_with_no_gpu(sim, capsys) -> None:
    """`run`'s documented fallback, now `lease()`'s too: no driver and no GPU asked for."""
    import gpuwarden

    sim("laptop-none")
    with gpuwarden.lease() as gpus:
        assert gpus.gpus == () and gpus.visible == "" and gpus.fds == ()
        assert gpus.env["CUDA_VISIBLE_DEVICES"] == ""
    assert "the block runs with no GPU" in capsys.readouterr().err
    from gpuwarden.base.errors import UserError

    with pytest.raises(UserError), gpuwarden.lease(1):  # by number: refused, as `run -g 1`
        pass


def test_reserve_inside_a_run_job_says_the_gpus_are_held_already(sim, cli) -> None:
    sim("server-8xa100")
    r = cli("run", "-g", "1", "--", sys.executable, "-m", "gpuwarden", "reserve")
    assert r.returncode == 2
    assert "already inside" in r.stderr and "reserve more from outside it" in r.stderr
