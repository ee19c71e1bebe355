"""Lease record files made ahead (leases.spares): a take that uses one creates no file,
and its record still reaches its name whole; files of an earlier judgement of the
directory are never used there; a crashed maker's files are swept by others."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import gpuwarden.leases as lease
from gpuwarden.jobs import allocation
from gpuwarden.leases import dir as leasedir
from gpuwarden.leases.spares import Spares
from gpuwarden.placement.request import Request
from machines import idle_a100s
from rawservice import Raw
from waiting import wait_for


def made(path: str) -> list[str]:
    return sorted(n for n in os.listdir(path) if n.startswith(".spare."))


def test_a_take_uses_a_file_made_ahead_and_publishes_it_whole(tmp_path: Path) -> None:
    ld = leasedir.open_dir(str(tmp_path / "leases"))
    spares = Spares()
    spares.stock(ld, 2)
    assert len(made(ld.path)) == 2 and not spares.short(2)
    snap = idle_a100s(2)
    out = allocation.attempt(ld, Request(count=1), snap, job="7", spares=spares)
    held = out.held
    assert held is not None
    hidden = sorted(n for n in os.listdir(ld.path) if n.startswith("."))
    assert hidden == made(ld.path)  # no temporary file of its own: one made ahead
    assert spares.short(2) and not spares.missed
    held.publish(os.getpid(), "a job")
    assert len(made(ld.path)) == 1  # the one used is the record now
    [info] = lease.list_leases(ld.path)  # the spare left is no lease
    assert (info.job, info.pid, info.command) == ("7", os.getpid(), "a job")
    record = Path(ld.path, f"{info.uuid}.7{lease.HOLDER_SUFFIX}").read_text()
    assert json.loads(record)["pid"] == os.getpid()
    held.release()
    spares.clear()
    assert made(ld.path) == [] and lease.list_leases(ld.path) == []


def test_files_of_an_earlier_judgement_are_not_used_and_go(tmp_path: Path) -> None:
    checked = leasedir.Checked()
    path = str(tmp_path / "leases")
    first = checked.open(path)
    spares = Spares()
    spares.stock(first, 1)
    os.chmod(path, 0o1777)  # judged again: another LeaseDir (the directory may be another)
    again = checked.open(path)
    assert again is not first
    assert spares.take(again) is None and spares.short(1)
    spares.stock(again, 1)
    assert len(made(path)) == 1 and spares.dir is again
    spares.clear()


def test_a_dead_maker_s_files_are_swept_by_the_next_taker(tmp_path: Path) -> None:
    """A service killed with files made ahead leaves them unlocked: old ones are
    removed by the next attempt's sweep, as any writer's temporary file."""
    path = str(tmp_path / "leases")
    ld = leasedir.open_dir(path)
    code = (
        "import sys; from gpuwarden.leases import dir as d; from gpuwarden.leases.spares "
        "import Spares; Spares().stock(d.open_dir(sys.argv[1]), 2)"
    )
    subprocess.run([sys.executable, "-c", code, path], check=True)  # exits: unlocked
    left = made(path)
    assert len(left) == 2
    old = time.time() - lease.TMP_AGE - 60
    os.utime(os.path.join(path, left[0]), (old, old))
    out = allocation.attempt(ld, Request(count=1), idle_a100s(1), job="8")
    assert out.held is not None
    assert made(path) == left[1:]  # the old one swept, the young one left
    out.held.release()


def test_the_service_makes_them_after_its_starts_and_removes_them_when_it_stops(
    raw_service: Raw, tmp_path: Path
) -> None:
    service = raw_service
    work = {"argv": ["true"], "cwd": str(tmp_path), "env": {"PATH": "/usr/bin:/bin"}}
    ran = service.call("submit", **work, output="/dev/null", request={"count": 1})["job"]
    wait_for(lambda: service.call("queue", ids=[ran])["total"] == 0, 60, f"job {ran} to end")
    leases = str(tmp_path / "leases")
    wait_for(lambda: len(made(leases)) == 4, 30, "a record file made ahead for each GPU")
    os.kill(service.pid, signal.SIGTERM)
    wait_for(lambda: made(leases) == [], 30, lambda: f"the files removed: {made(leases)}")
