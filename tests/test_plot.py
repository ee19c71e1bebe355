"""The picture from a recording: spans, series, and that a PNG is written."""

from __future__ import annotations

import pytest

from gpuwarden.base.errors import UserError
from gpuwarden.leases import LeaseInfo
from gpuwarden.machine.inventory import Gpu, Snapshot
from gpuwarden.monitoring.plot import plot, series, spans
from gpuwarden.monitoring.sampling import COLUMNS, rows


def test_spans():
    assert spans([0, 1, 2, 3, 4], ["", "a", "a", "", "b"]) == [(1, 3, "a"), (4, 4, "b")]
    assert spans([0, 1], ["", ""]) == []


def recording(n: int = 30) -> list[dict[str, str]]:
    out = []
    for i in range(n):
        gpus = tuple(
            Gpu(k, f"GPU-{k}", name="A100", memory_total=40 * 2**30,
                memory_used=(i * k % 40) * 2**30, utilization_gpu=(i * 7 + k * 13) % 100)
            for k in range(3)
        )  # fmt: skip
        leases = [LeaseInfo("GPU-1", "alice", 1, "x", 0.0)] if 5 <= i < 20 else []
        drains = {"GPU-2": type("D", (), {"reason": "health: XID 79"})()} if i >= 22 else {}
        for row in rows(Snapshot(1_700_000_000.0 + i, "box", gpus), leases, drains):
            out.append(dict(zip(COLUMNS, row)))
    return out


def test_series_per_gpu_sorted():
    data = series(list(reversed(recording(5))))
    assert sorted(data) == [0, 1, 2]
    assert data[1]["t"] == sorted(data[1]["t"])
    assert data[1]["mem"][1] == pytest.approx(1 / 40 * 100)


def test_plot_writes_png(tmp_path):
    out = plot(recording(), str(tmp_path / "usage.png"))
    with open(out, "rb") as fh:
        data = fh.read()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000


def test_plot_empty_and_unwritable(tmp_path):
    with pytest.raises(UserError, match="no samples"):
        plot([], str(tmp_path / "x.png"))
    with pytest.raises(UserError, match="cannot write"):
        plot(recording(3), str(tmp_path / "missing" / "x.png"))


def test_cli_plot(cli, tmp_path):
    import csv

    path = tmp_path / "r.csv"
    with open(path, "w", newline="") as fh:
        writer = csv.DictWriter(fh, COLUMNS)
        writer.writeheader()
        writer.writerows(recording(10))
    done = cli("plot", str(path), "-o", str(tmp_path / "u.png"))
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "u.png").stat().st_size > 5000
    bad = cli("plot", str(tmp_path / "none.csv"))
    assert bad.returncode == 2 and "cannot read" in bad.stderr
