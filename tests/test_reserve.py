"""`gpuwarden reserve` / `release`: a detached holder keeps the lease."""

from __future__ import annotations

import os
import time

import gpuwarden.leases as lease
from shells import exports
from waiting import wait_for


def test_reserve_holds_until_release(sim, cli) -> None:
    sim("server-8xa100")
    r = cli("reserve", "-g", "1", "--for", "1h")
    assert r.returncode == 0, r.stderr
    env = exports(r.stdout)
    assert env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
    rid = env["GPUWARDEN_RESERVATION"]
    [info] = lease.list_leases()
    assert info.job == rid and str(info.index) == env["CUDA_VISIBLE_DEVICES"]
    assert info.expires is not None and info.expires - time.time() > 3500
    # the holder outlived `reserve`; the GPU is not handed out again
    r2 = cli("run", "--gpus", env["CUDA_VISIBLE_DEVICES"], "--", "true")
    assert r2.returncode == lease.EXIT_BUSY
    r3 = cli("release", env={"GPUWARDEN_RESERVATION": rid})
    assert r3.returncode == 0, r3.stderr
    assert r3.stdout.startswith("unset CUDA_VISIBLE_DEVICES")
    assert lease.list_leases() == []
    # Released without eval: the shell still names it; a second release clears it.
    again = cli("release", env={"GPUWARDEN_RESERVATION": rid})
    assert again.returncode == 0 and again.stdout == r3.stdout, again.stderr
    assert "has ended already" in again.stderr
    assert cli("run", "--gpus", env["CUDA_VISIBLE_DEVICES"], "--", "true").returncode == 0


def test_reservation_expires(sim, cli) -> None:
    sim("server-8xa100")
    r = cli("reserve", "-g", "1", "--for", "3s")
    assert r.returncode == 0, r.stderr
    assert len(lease.list_leases()) == 1
    wait_for(lambda: not lease.list_leases(), 8, "the lease's end")


def test_killed_holder_frees_the_gpu(sim, cli) -> None:
    sim("server-8xa100")
    r = cli("reserve", "-g", "1")
    assert r.returncode == 0, r.stderr
    [info] = lease.list_leases()
    os.kill(info.pid, 9)
    wait_for(lambda: not lease.list_leases(), 10, "the lease freed", 0.01)


def test_release_bad_input(sim, cli) -> None:
    sim("server-8xa100")
    r = cli("release")
    assert r.returncode == 2 and "you hold no reservation" in r.stderr
    r = cli("release", "res-nope")
    assert r.returncode == 2 and "no reservation 'res-nope'" in r.stderr
    r = cli("reserve", "-g", "0")
    assert r.returncode == 2 and "reserves nothing" in r.stderr
    r = cli("reserve", "-g", "1", "--for", "forever")
    assert r.returncode == 2 and "invalid duration" in r.stderr
    r = cli("reserve", "-g", "9")
    assert r.returncode == 2 and "only 8 GPUs" in r.stderr
    assert lease.list_leases() == []


def test_release_picks_your_only_reservation(sim, cli) -> None:
    sim("server-8xa100")
    a = exports(cli("reserve", "-g", "1").stdout)["GPUWARDEN_RESERVATION"]
    b = exports(cli("reserve", "-g", "1").stdout)["GPUWARDEN_RESERVATION"]
    r = cli("release")
    assert r.returncode == 2 and "several reservations" in r.stderr
    assert cli("release", a).returncode == 0
    r = cli("release")
    assert r.returncode == 0, r.stderr
    assert b in r.stderr
    assert lease.list_leases() == []


def test_run_inside_a_reservation_uses_it(sim, cli, tmp_path) -> None:
    sim("server-8xa100")
    env = exports(cli("reserve", "-g", "1").stdout)
    out = tmp_path / "visible"
    code = f"import os; open({str(out)!r}, 'w').write(os.environ['CUDA_VISIBLE_DEVICES'])"
    r = cli("run", "-g", "1", "--", "python3", "-c", code, env=env)
    assert r.returncode == 0, r.stderr
    assert out.read_text() == env["CUDA_VISIBLE_DEVICES"]
    r = cli("run", "-g", "2", "--", "true", env=env)
    assert r.returncode == 2 and "leaves only 1 GPU visible" in r.stderr
    assert cli("release", env=env).returncode == 0


def test_a_service_socket_nobody_answers_holds_nothing(sim, cli, tmp_path) -> None:
    """Where a queue service's socket is, `reserve` holds through the service
    (tests/test_interactive_time.py); a socket left behind by a stopped one is said in
    one line, and nothing is held."""
    import socket

    sim("server-8xa100")
    path = str(tmp_path / "service.sock")
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as listener:
        listener.bind(path)
        r = cli("reserve", "-g", "2", "--for", "1h", env={"GPUWARDEN_SOCKET": path})
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr == (
        f"gpuwarden reserve: the gpuwarden service does not answer at {path} (stopped or "
        "crashed, its socket left behind); an admin restarts it (`gpuwarden service status` "
        "says more)\n"
    )
    assert lease.list_leases() == []
