"""CSV rows, rotation by size, and bad files."""

from __future__ import annotations

import csv
import os

import pytest

from gpuwarden.base.errors import UserError
from gpuwarden.leases import LeaseInfo
from gpuwarden.machine.inventory import Gpu, GpuProcess, Snapshot
from gpuwarden.monitoring.sampling import COLUMNS, Recorder, read_csv, record, rows, to_csv

GiB = 2**30


def snap(t: float = 1_700_000_000.0, util: int = 40) -> Snapshot:
    return Snapshot(
        t,
        "box",
        (
            Gpu(
                0,
                "GPU-aaaa",
                name="A100",
                memory_used=3 * GiB,
                memory_total=40 * GiB,
                utilization_gpu=util,
                utilization_memory=10,
                temperature=55,
                power_draw=123.45,
                clock_sm=1410,
                processes=(GpuProcess(7, 2 * GiB, "bob"), GpuProcess(5, GiB, "alice")),
            ),
            Gpu(1, "GPU-bbbb", name="A100", lost=True),
        ),
    )


def test_rows_like_dmon_with_owners():
    lease = LeaseInfo("GPU-aaaa", "alice", 5, "python t.py", 1.0, job="exp1")
    table = rows(snap(), [lease], {"GPU-bbbb": type("D", (), {"reason": "lost"})()}, {})
    assert len(table) == 2 and all(len(r) == len(COLUMNS) for r in table)
    row = dict(zip(COLUMNS, table[0]))
    assert row["gpu"] == "0" and row["sm_pct"] == "40" and row["fb_used_mib"] == "3072"
    assert row["pwr_w"] == "123.5" and row["pclk_mhz"] == "1410"
    assert row["users"] == "alice;bob" and row["pids"] == "5:1024;7:2048"
    assert row["lease_users"] == "alice" and row["lease_jobs"] == "exp1"
    lost = dict(zip(COLUMNS, table[1]))
    assert lost["health"] == "lost" and lost["drained"] == "lost" and lost["sm_pct"] == ""


def test_record_appends_with_one_header(tmp_path):
    path = tmp_path / "r.csv"
    assert record(str(path), interval=0, count=2, read=snap, sleep=lambda s: None) == 2
    assert record(str(path), interval=0, count=1, read=snap, sleep=lambda s: None) == 1
    lines = path.read_text().splitlines()
    assert lines[0] == ",".join(COLUMNS) and lines.count(lines[0]) == 1
    assert len(read_csv(str(path))) == 6


def test_rotation_by_size(tmp_path):
    path = tmp_path / "r.csv"
    one = len(to_csv(rows(snap())))
    rec = Recorder(str(path), max_bytes=one * 3, keep=2)
    for _ in range(10):
        rec.write(to_csv(rows(snap())))
    assert path.stat().st_size <= one * 3
    assert (tmp_path / "r.csv.1").exists() and (tmp_path / "r.csv.2").exists()
    assert not (tmp_path / "r.csv.3").exists()
    for part in (path, tmp_path / "r.csv.1"):
        with open(part) as fh:
            assert next(csv.reader(fh)) == list(COLUMNS)


def test_unwritable_file_is_one_clear_line(tmp_path):
    locked = tmp_path / "ro"
    locked.mkdir()
    locked.chmod(0o500)

    def attempt() -> None:
        with pytest.raises(UserError, match=r"cannot write .*ro/r.csv: Permission denied"):
            Recorder(str(locked / "r.csv"))

    if os.geteuid() != 0:
        attempt()
        return
    # Root writes anywhere (CI runs as root): make the attempt as nobody, in a child.
    # Nobody cannot read root's Python install, so everything is imported first.
    Recorder(str(tmp_path / "warm.csv"))
    with pytest.raises(UserError):
        Recorder(str(tmp_path))
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            os.setgid(65534)
            os.setuid(65534)
            attempt()
            code = 0
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, "nobody could write, or the error differs"


def test_missing_dir_directory_and_foreign_file(tmp_path):
    with pytest.raises(UserError, match="No such file or directory"):
        Recorder(str(tmp_path / "nope" / "r.csv"))
    with pytest.raises(UserError, match="is a directory"):
        Recorder(str(tmp_path))
    other = tmp_path / "other.csv"
    other.write_text("a,b\n1,2\n")
    with pytest.raises(UserError, match="not a gpuwarden recording"):
        Recorder(str(other))
    with pytest.raises(UserError, match="not a gpuwarden recording"):
        read_csv(str(other))


def test_cli_unwritable(cli, tmp_path):
    done = cli("--sim", "server-8xa100", "record", str(tmp_path / "no" / "x.csv"), "--count", "1")
    assert done.returncode == 2
    assert done.stderr.strip().splitlines()[-1].startswith("gpuwarden record: cannot write")
